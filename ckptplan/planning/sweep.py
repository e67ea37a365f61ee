"""The memory/step-time frontier of every strategy on one model.

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

from ckptplan.budget import ResolvedBudget, format_budget_at_least, format_bytes
from ckptplan.devices import get_device
from ckptplan.loading import Workload
from ckptplan.plan import Plan, PlanSettings
from ckptplan.planning.problem import selective_menus, to_chain
from ckptplan.planning.schedule_plan import plan_from_schedule
from ckptplan.planning.search import selective_pays
from ckptplan.profiling.profiler import Settings, profile_model
from ckptplan.progress import QUIET, Progress
from ckptplan.solvers import baselines, dp
from ckptplan.solvers.chain import Schedule
from ckptplan.solvers.selective import thin
from ckptplan.verifying.peers import measure_compile_budget
from ckptplan.verifying.verification import verify_plan

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
        line = (
            f"plans for {s.device} · {precision} · batch {s.batch_size or 'the model default'} · "
            f"optimizer {s.optimizer} · predictions from {times}"
        )
        if self.measured_on:
            line += f" · measured on {self.measured_on} (median of --repeats {self.repeats})"
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
                max_grad_abs_diff=measured.max_grad_abs_diff,
            )
        )
    return points


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


def _family(strategy: str) -> str:
    """every-2, every-3 -> every-k; compile-0.5 -> compile."""
    if strategy.startswith("every"):
        return "every-k"
    return strategy.split("-")[0] if strategy.startswith("compile") else strategy


def _xy(point: SweepPoint, measured: bool) -> tuple[float, float] | None:
    """Peak and overhead, measured or predicted; None where the point has no such figures."""
    peak = point.measured_peak_bytes if measured else point.predicted_peak_bytes
    overhead = point.measured_overhead if measured else point.predicted_overhead
    return None if peak is None or overhead is None else (float(peak), float(overhead))


def _unit(largest: float) -> tuple[str, float]:
    """The binary unit (name, size) that ``format_bytes`` reads ``largest`` in."""
    unit = format_bytes(largest).split()[-1]
    return unit, {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10}.get(unit, 1)


def terminal_plot(
    result: Sweep, budget: int | None = None, width: int = 64, height: int = 16
) -> str:
    """A scatter of overhead (up) against peak (right), one letter per strategy; measured
    figures where the sweep measured them, and ``┊`` at the budget (``show_sweep`` prints the
    settings above it)."""
    coords = [(p, xy) for p in result.points if (xy := _xy(p, result.measured)) is not None]
    xs = [xy[0] for _, xy in coords] + ([budget] if budget else [])
    ys = [xy[1] for _, xy in coords]
    x0, x1 = min(xs), max(xs) or 1.0
    y0, y1 = min(0.0, *ys), max(ys) or 1.0
    grid = [[" "] * width for _ in range(height)]

    def column(x: float) -> int:
        return round((x - x0) / ((x1 - x0) or 1) * (width - 1))

    if budget:
        for row in grid:
            row[column(budget)] = "┊"
    letters: dict[str, str] = {}
    for p, (x, y) in coords:
        letter = letters.setdefault(_family(p.strategy), "NFSEDAC"[len(letters) % 7])
        grid[height - 1 - round((y - y0) / ((y1 - y0) or 1) * (height - 1))][column(x)] = letter
    what = f"measured on {result.measured_on}" if result.measured else "predicted"
    unit, size = _unit(x1)
    lines = [f"recompute overhead, {what}: up to {100 * y1:.0f}% ┐"]
    lines += ["│" + "".join(r) for r in grid]
    lines.append("└" + "─" * width + f" peak, {what}: {x0 / size:.3g}…{x1 / size:.3g} {unit}")
    legend = "  ".join(f"{v}={k}" for k, v in letters.items())
    lines.append(legend + (f"  ┊=budget {format_bytes(budget)}" if budget else ""))
    return "\n".join(lines)


def save_plot(result: Sweep, path: str, budget: int | None = None) -> None:
    """PNG or SVG by the file's suffix; needs matplotlib (``pip install 'ckptplan[plot]'``).

    Predicted figures are hollow markers on dashed lines, measured ones filled on solid lines;
    the budget, if given, is a vertical line; the settings are the caption.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from ckptplan.errors import CkptplanError

        raise CkptplanError(
            "plotting needs matplotlib: pip install 'ckptplan[plot]' (or drop --plot)"
        ) from None
    peaks = [p.predicted_peak_bytes or p.measured_peak_bytes or 0 for p in result.points]
    unit, size = _unit(max([*peaks, budget or 0]))
    figure, axes = plt.subplots(figsize=(7.5, 5))
    families: dict[str, list[SweepPoint]] = {}
    for p in result.points:
        families.setdefault(_family(p.strategy), []).append(p)
    for index, (family, members) in enumerate(families.items()):
        color = f"C{index}"
        frontier = family in ("dp", "auto")
        marker = "o" if frontier else "^" if family == "compile" else "s"
        for measured in (False, True) if result.measured else (False,):
            xy = sorted(c for m in members if (c := _xy(m, measured)) is not None)
            if not xy:
                continue
            axes.plot(
                [x / size for x, _ in xy],
                [100 * y for _, y in xy],
                marker=marker,
                linestyle=("-" if measured else "--") if frontier else "",
                color=color,
                markerfacecolor=color if measured else "none",
                label=f"{family}, {'measured' if measured else 'predicted'}",
            )
    if budget:
        label = f"budget {format_bytes(budget)}"
        axes.axvline(budget / size, color="red", linestyle=":", label=label)
    what = f"measured on {result.measured_on} and predicted" if result.measured else "predicted"
    axes.set_xlabel(f"peak memory of one training step ({unit})")
    axes.set_ylabel("recompute overhead (% of the unchecked step time)")
    axes.set_title(f"{result.model}: overhead against peak memory, {what}")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.text(0.01, 0.01, result.caption(), fontsize=7, wrap=True)
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    with plt.rc_context({"svg.fonttype": "none"}):  # an SVG's words stay text, for a report
        figure.savefig(path)
    plt.close(figure)
