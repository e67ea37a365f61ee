"""The memory/step-time frontier of every strategy on one model (``sweep_plot`` draws it).

Fixed policies (none, full, every-k, sqrt) give one point each; ``dp`` and ``auto`` give their
whole Pareto frontier from one pass of the chain DP, thinned to a few points, and ``auto`` also
gives its plan at each fixed policy's peak, so every fixed point has a rival of no larger peak. With
``verify`` every point is also run for real (measured peak and step-time ratio). Every point of
ckptplan's own is a plan (``save_plans``); figures say what was predicted and what measured.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ckptplan.devices import get_device
from ckptplan.loading import Workload
from ckptplan.planning.problem import selective_menus, to_chain
from ckptplan.planning.schedule_plan import plan_from_schedule
from ckptplan.planning.search import selective_pays
from ckptplan.profiling.profiler import Settings, profile_model
from ckptplan.progress import QUIET, Progress
from ckptplan.solvers import baselines, dp
from ckptplan.solvers.chain import Schedule
from ckptplan.solvers.selective import thin
from ckptplan.values.budget import ResolvedBudget, format_budget_at_least
from ckptplan.values.plan import Plan, PlanSettings
from ckptplan.verifying.peers import measure_compile_budget
from ckptplan.verifying.verification import verify_plan
from ckptplan.wording import batch_words

log = logging.getLogger("ckptplan")


@dataclass(frozen=True)
class SweepOptions:
    """What a sweep covers and how it measures: the frontiers' points, the every-k policies,
    and with ``verify`` the timed steps per point on ``run_on`` (default CUDA where present)."""

    points: int = 6
    every: Sequence[int] = (2, 3)
    verify: bool = False
    repeats: int = 3
    run_on: str | None = None
    compile_budgets: Sequence[float] = (0.75, 0.5, 0.25, 0.0)
    """``torch.compile``'s ``activation_memory_budget`` values measured beside the plans."""


@dataclass(frozen=True)
class SweepPoint:
    """One strategy's plan: predicted figures, and measured ones when it was run.

    ``torch.compile``'s memory budget has no prediction (``predicted_*`` are None) and no plan.
    """

    strategy: str
    predicted_peak_bytes: int | None
    predicted_overhead: float | None
    regions: int
    measured_peak_bytes: int | None = None
    measured_overhead: float | None = None
    max_grad_abs_diff: float | None = None
    measured_overhead_range: tuple[float, float] | None = None
    """Least and greatest overhead of the timed runs (``measured_overhead`` is their median)."""
    plan: Plan | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["plan"]
        return data


@dataclass(frozen=True)
class Sweep:
    """The points, and what they were made for and measured on (a figure's caption)."""

    model: str
    settings: Settings
    points: list[SweepPoint]
    unchecked_peak_bytes: int
    measured_on: str | None = None
    repeats: int = 0

    @property
    def measured(self) -> bool:
        return self.measured_on is not None

    def caption(self) -> str:
        """The settings every point shares, in one line."""
        s = self.settings
        precision = s.dtype + (f" autocast {s.autocast}" if s.autocast else "")
        times = "op times measured here" if s.measure else f"the {s.device} roofline"
        inputs = next((p.plan.inputs for p in self.points if p.plan is not None), None)
        line = (
            f"plans for {s.device} · {precision} · {batch_words(s.batch_size, inputs)} · "
            f"optimizer {s.optimizer} · predictions from {times}"
        )
        if self.measured_on:
            runs = (
                "1 run per point, no spread"
                if self.repeats == 1
                else f"median ± half the range of {self.repeats} timed runs per point"
            )
            line += f" · measured on {self.measured_on} ({runs})"
        return line


def sweep(
    workload: Workload,
    settings: Settings,
    options: SweepOptions | None = None,
    progress: Progress = QUIET,
) -> Sweep:
    """Predicted (and with ``options.verify``, measured) peak and overhead of every strategy,
    with ``torch.compile``'s memory budgets measured beside them (they predict nothing)."""
    options = options or SweepOptions()
    progress.phase("profiling one training step on fake tensors")
    profile = profile_model(workload, settings)
    progress.phase("solving every strategy")
    menus = selective_menus(profile)
    chain = to_chain(profile, menus=menus)
    fixed = [baselines.none(chain), baselines.full(chain), baselines.sqrt(chain)]
    fixed += [baselines.every_k(chain, k) for k in options.every]
    segments = dp.frontier(chain)
    auto = [
        _paying(s, segments, profile.step_time, get_device(settings.device).selective_slack)
        for s in dp.frontier(chain, selective=True, name="auto")
    ]
    chosen = thin(auto, options.points)
    # Beside every fixed policy, auto at that policy's own peak: the head-to-head comparison.
    for policy in fixed:
        rival = _fastest_within(auto, policy.peak)
        if rival is not None and rival not in chosen:
            chosen.append(rival)
    schedules = [*fixed, *thin(segments, options.points)]
    schedules += sorted(chosen, key=lambda s: s.recompute_time)
    out, measured_on = [], None
    for index, schedule in enumerate(schedules, 1):
        budget = format_budget_at_least(schedule.peak)
        plan = plan_from_schedule(
            profile, chain, schedule, ResolvedBudget(budget, schedule.peak), menus
        )
        point = SweepPoint(
            strategy=schedule.solver,
            predicted_peak_bytes=schedule.peak,
            predicted_overhead=plan.predicted.overhead,
            regions=len(plan.regions),
            plan=plan,
        )
        if options.verify:
            progress.phase(f"measuring point {index}/{len(schedules)} ({schedule.solver})")
            result = verify_plan(workload, plan, device=options.run_on, repeats=options.repeats)
            point = replace(
                point,
                measured_peak_bytes=result.measured_peak_bytes,
                measured_overhead=result.step_time_ratio - 1,
                measured_overhead_range=_less_one(result.step_time_ratio_range),
                max_grad_abs_diff=result.max_grad_abs_diff,
            )
            measured_on = result.device
        out.append(point)
    if options.verify:
        out += _compile_points(workload, settings, options, progress)
    repeats = options.repeats if options.verify else 0
    return Sweep(workload.name, settings, out, fixed[0].peak, measured_on, repeats)


def _compile_points(
    workload: Workload, settings: Settings, options: SweepOptions, progress: Progress
) -> list[SweepPoint]:
    points = []
    the_plans = PlanSettings(**asdict(settings))
    for budget in options.compile_budgets:
        progress.phase(f"measuring torch.compile's activation_memory_budget {budget:g}")
        try:
            measured = measure_compile_budget(
                workload, the_plans, budget, device=options.run_on, repeats=options.repeats
            )
        except Exception as exc:  # a peer's failure must not lose ckptplan's own points
            log.warning("torch.compile budget %g not measured: %s", budget, exc)
            continue
        points.append(
            SweepPoint(
                strategy=f"compile-{budget:g}",
                predicted_peak_bytes=None,
                predicted_overhead=None,
                regions=0,
                measured_peak_bytes=measured.measured_peak_bytes,
                measured_overhead=measured.step_time_s / measured.baseline_step_time_s - 1,
                measured_overhead_range=_less_one(measured.step_time_ratio_range),
                max_grad_abs_diff=measured.max_grad_abs_diff,
            )
        )
    return points


def _less_one(ratios: tuple[float, float]) -> tuple[float, float]:
    """The overheads of a range of step-time ratios."""
    return ratios[0] - 1, ratios[1] - 1


def save_plans(result: Sweep, folder: str | Path) -> list[Path]:
    """Every point's plan as ``STRATEGY-PEAK.json`` in ``folder`` (``auto-1.55MiB.json``; a
    second point of the same name gets ``-2``), each a plan ``apply`` and ``verify`` take."""
    directory = Path(folder)
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for point in result.points:
        if point.plan is None:
            continue
        stem = f"{point.strategy}-{point.plan.budget.text}"
        path, n = directory / f"{stem}.json", 1
        while path in written:
            n += 1
            path = directory / f"{stem}-{n}.json"
        point.plan.save(path)
        written.append(path)
    return written


def _paying(
    schedule: Schedule, segments: Sequence[Schedule], step_time: float, margin: float
) -> Schedule:
    """Auto's plan as ``solve`` returns it: dp's plan for the same peak where a selective
    plan is not predicted to pay for itself (``search.selective_pays``)."""
    rival = _fastest_within(segments, schedule.peak)
    if rival is None or selective_pays(
        schedule.recompute_time, rival.recompute_time, step_time, margin if schedule.options else 0
    ):
        return schedule
    return replace(rival, solver="auto")


def _fastest_within(frontier: Sequence[Schedule], peak: int) -> Schedule | None:
    """The frontier's plan of least recompute whose peak is at most ``peak``."""
    fitting = [s for s in frontier if s.peak <= peak]
    return min(fitting, key=lambda s: (s.recompute_time, s.peak)) if fitting else None
