"""Torch-free optimisation: checkpointing schedules for chains and graphs.

Installed as ``ckptplan.solvers``. Nothing here imports torch: problems are plain numbers.
"""

from __future__ import annotations

from ckptplan.solvers import baselines, dp
from ckptplan.solvers.chain import Chain, InfeasibleBudget, Schedule

SOLVERS = ("auto", "dp", "sqrt", "full", "every-k", "none")
BASELINES = ("none", "full", "sqrt")


def run_solver(
    name: str,
    chain: Chain,
    budget: int | None,
    every: int = 2,
    max_segment: int | None = None,
) -> Schedule:
    """Run a chain solver by name; ``budget=None`` asks a baseline for its fixed plan.

    Raises ``InfeasibleBudget`` when the plan cannot fit ``budget``.
    """
    if name in ("dp", "auto"):
        if budget is None:
            raise ValueError(f"{name} needs a budget")
        return dp.solve(chain, budget, max_segment, selective=name == "auto", name=name)
    fixed = {
        "none": baselines.none,
        "full": baselines.full,
        "sqrt": baselines.sqrt,
        "every-k": lambda c: baselines.every_k(c, every),
    }
    if name not in fixed:
        raise ValueError(f"unknown solver {name!r}")
    schedule = fixed[name](chain)
    if budget is not None and schedule.peak > budget:
        raise InfeasibleBudget(budget, schedule.peak)
    return schedule
