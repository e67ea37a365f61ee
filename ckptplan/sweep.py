"""The memory/step-time frontier of every strategy on one model.

Fixed policies (none, full, every-k, sqrt) give one point each; ``dp`` and ``auto`` give their
whole Pareto frontier from one pass of the chain DP, thinned to a few points, and ``auto`` also
gives its plan at each fixed policy's peak, so every fixed point has a rival of no larger peak. With
``verify=True`` every point is also run for real (measured peak and step-time ratio).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ckptplan.api import plan_from_schedule, selective_pays
from ckptplan.devices import get_device
from ckptplan.loading import Workload
from ckptplan.measure import measure_compile_budget, verify_plan
from ckptplan.problem import selective_menus, to_chain
from ckptplan.profiler import Settings, profile_model
from ckptplan.solvers import baselines, dp
from ckptplan.solvers.chain import Schedule
from ckptplan.solvers.selective import thin

log = logging.getLogger("ckptplan")


@dataclass(frozen=True)
class SweepPoint:
    """One strategy's plan: predicted figures, and measured ones when it was run.

    ``torch.compile``'s memory budget has no prediction (``predicted_*`` are None).
    """

    strategy: str
    predicted_peak_bytes: int | None
    predicted_overhead: float | None
    regions: int
    measured_peak_bytes: int | None = None
    measured_overhead: float | None = None
    max_grad_abs_diff: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def sweep(
    workload: Workload,
    settings: Settings,
    points: int = 6,
    every: Sequence[int] = (2, 3),
    verify: bool = False,
    repeats: int = 3,
    compile_budgets: Sequence[float] = (0.75, 0.5, 0.25, 0.0),
) -> list[SweepPoint]:
    """Predicted (and with ``verify``, measured) peak and overhead of every strategy.

    With ``verify``, ``torch.compile``'s ``activation_memory_budget`` at ``compile_budgets`` is
    measured beside them (it predicts nothing, so it appears only measured).
    """
    profile = profile_model(workload, settings)
    menus = selective_menus(profile)
    chain = to_chain(profile, menus=menus)
    fixed = [baselines.none(chain), baselines.full(chain), baselines.sqrt(chain)]
    fixed += [baselines.every_k(chain, k) for k in every]
    segments = dp.frontier(chain)
    auto = [
        _paying(s, segments, profile.step_time, get_device(settings.device).selective_margin)
        for s in dp.frontier(chain, selective=True, name="auto")
    ]
    chosen = thin(auto, points)
    # Beside every fixed policy, auto at that policy's own peak: the head-to-head comparison.
    for policy in fixed:
        rival = _fastest_within(auto, policy.peak)
        if rival is not None and rival not in chosen:
            chosen.append(rival)
    schedules = [*fixed, *thin(segments, points)]
    schedules += sorted(chosen, key=lambda s: s.recompute_time)
    out = []
    for schedule in schedules:
        plan = plan_from_schedule(profile, chain, schedule, "sweep", schedule.peak, menus=menus)
        point = SweepPoint(
            strategy=schedule.solver,
            predicted_peak_bytes=schedule.peak,
            predicted_overhead=plan.predicted["overhead"],
            regions=len(plan.regions),
        )
        if verify:
            result = verify_plan(workload, plan, repeats=repeats)
            point = SweepPoint(
                **{
                    **asdict(point),
                    "measured_peak_bytes": result.measured_peak_bytes,
                    "measured_overhead": result.step_time_ratio - 1,
                    "max_grad_abs_diff": result.max_grad_abs_diff,
                }
            )
        out.append(point)
    if verify:
        for budget in compile_budgets:
            try:
                measured = measure_compile_budget(
                    workload, asdict(settings), budget, repeats=repeats
                )
            except Exception as exc:  # a peer's failure must not lose ckptplan's own points
                log.warning("torch.compile budget %g not measured: %s", budget, exc)
                continue
            out.append(
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
    return out


def _paying(
    schedule: Schedule, segments: Sequence[Schedule], step_time: float, margin: float
) -> Schedule:
    """Auto's plan as ``solve`` returns it: dp's plan for the same peak where a selective
    plan is not predicted to pay for itself (``api.selective_pays``)."""
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


def terminal_plot(points: Sequence[SweepPoint], width: int = 64, height: int = 16) -> str:
    """A scatter of overhead (up) against peak (right), one letter per strategy."""
    measured = all(p.measured_peak_bytes is not None for p in points)

    def xy(p: SweepPoint) -> tuple[float, float]:
        if measured:
            return float(p.measured_peak_bytes or 0), float(p.measured_overhead or 0.0)
        return float(p.predicted_peak_bytes or 0), float(p.predicted_overhead or 0.0)

    coords = [xy(p) for p in points]
    xs, ys = [c[0] for c in coords], [c[1] for c in coords]
    x0, x1 = min(xs), max(xs) or 1.0
    y0, y1 = min(0.0, min(ys)), max(ys) or 1.0
    grid = [[" "] * width for _ in range(height)]
    letters: dict[str, str] = {}
    for p, (x, y) in zip(points, coords, strict=True):
        family = _family(p.strategy)
        letter = letters.setdefault(family, "NFSEDAC"[len(letters) % 7])
        col = round((x - x0) / ((x1 - x0) or 1) * (width - 1))
        row = height - 1 - round((y - y0) / ((y1 - y0) or 1) * (height - 1))
        grid[row][col] = letter
    legend = "  ".join(f"{v}={k}" for k, v in letters.items())
    what = "measured" if measured else "predicted"
    lines = [f"{what} overhead {100 * y1:.0f}% ┐"]
    lines += ["│" + "".join(r) for r in grid]
    lines.append("└" + "─" * width + f" peak {x0 / 2**30:.3g}…{x1 / 2**30:.3g} GiB")
    lines.append(legend)
    return "\n".join(lines)


def save_plot(points: Sequence[SweepPoint], path: str, title: str) -> None:
    """PNG or SVG by the file's suffix; needs matplotlib (``pip install 'ckptplan[plot]'``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from ckptplan.errors import CkptplanError

        raise CkptplanError(
            "plotting needs matplotlib: pip install 'ckptplan[plot]' (or drop --plot)"
        ) from None
    figure, axes = plt.subplots(figsize=(7, 4.5))
    families: dict[str, list[SweepPoint]] = {}
    for p in points:
        families.setdefault(_family(p.strategy), []).append(p)
    for family, members in families.items():
        measured = all(m.measured_peak_bytes is not None for m in members)
        xs = [
            (m.measured_peak_bytes if measured else m.predicted_peak_bytes) / 2**30 for m in members
        ]
        ys = [
            100 * ((m.measured_overhead if measured else m.predicted_overhead) or 0.0)
            for m in members
        ]
        style = "-o" if family in ("dp", "auto") else "^" if family == "compile" else "s"
        axes.plot(xs, ys, style, label=family)
    axes.set_xlabel("peak memory of a step (GiB)")
    axes.set_ylabel("step-time overhead (%)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
