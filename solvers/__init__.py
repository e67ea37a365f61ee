"""Torch-free optimisation: checkpointing schedules for chains and graphs.

Installed as ``ckptplan.solvers``. Nothing here imports torch: problems are plain numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from ckptplan.solvers import baselines, dp
from ckptplan.solvers.chain import Chain, InfeasibleBudget, Schedule

SolverName = Literal["auto", "dp", "sqrt", "full", "every-k", "none"]
SOLVERS: tuple[SolverName, ...] = get_args(SolverName)
BASELINES: tuple[SolverName, ...] = ("none", "full", "sqrt")


@dataclass(frozen=True, kw_only=True)
class SolverOptions:
    """What tunes the chain solvers, one field per option: the CLI's flag of the same name
    and the API's keyword both land here (``ckptplan.options``), so that an option is its
    field, the solver that reads it, and its flag."""

    every: int = 2
    """k of ``every-k``: checkpoint every k-th block."""
    max_segment: int | None = None
    """The longest run of blocks one region of ``dp``/``auto`` may hold."""


def run_solver(
    name: str,
    chain: Chain,
    budget: int | None,
    options: SolverOptions | None = None,
) -> Schedule:
    """Run a chain solver by name; ``budget=None`` asks a baseline for its fixed plan.

    Raises ``InfeasibleBudget`` when the plan cannot fit ``budget``.
    """
    options = options or SolverOptions()
    if name in ("dp", "auto"):
        if budget is None:
            raise ValueError(f"{name} needs a budget")
        return dp.solve(chain, budget, options.max_segment, selective=name == "auto", name=name)
    fixed = {
        "none": baselines.none,
        "full": baselines.full,
        "sqrt": baselines.sqrt,
        "every-k": lambda c: baselines.every_k(c, options.every),
    }
    if name not in fixed:
        raise ValueError(f"unknown solver {name!r}")
    schedule = fixed[name](chain)
    if budget is not None and schedule.peak > budget:
        raise InfeasibleBudget(budget, schedule.peak)
    return schedule
