"""The memory/step-time frontier of every strategy on one model.

Fixed policies (none, full, every-k, sqrt) give one point each; ``dp`` and ``auto`` give their
whole Pareto frontier from one pass of the chain DP, thinned to a few points. With
``verify=True`` every point is also run for real (measured peak and step-time ratio).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ckptplan.api import plan_from_schedule
from ckptplan.loading import Workload
from ckptplan.measure import verify_plan
from ckptplan.problem import selective_menus, to_chain
from ckptplan.profiler import Settings, profile_model
from ckptplan.solvers import baselines, dp
from ckptplan.solvers.chain import Schedule


@dataclass(frozen=True)
class SweepPoint:
    strategy: str
    predicted_peak_bytes: int
    predicted_overhead: float
    regions: int
    measured_peak_bytes: int | None = None
    measured_overhead: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _thin(plans: list[Schedule], points: int) -> list[Schedule]:
    if len(plans) <= points:
        return plans
    step = (len(plans) - 1) / (points - 1)
    return [plans[round(i * step)] for i in range(points)]


def sweep(
    workload: Workload,
    settings: Settings,
    points: int = 6,
    every: Sequence[int] = (2, 3),
    verify: bool = False,
    repeats: int = 3,
) -> list[SweepPoint]:
    """Predicted (and with ``verify``, measured) peak and overhead of every strategy."""
    profile = profile_model(workload, settings)
    menus = selective_menus(profile)
    chain = to_chain(profile, menus=menus)
    schedules = [baselines.none(chain), baselines.full(chain), baselines.sqrt(chain)]
    schedules += [baselines.every_k(chain, k) for k in every]
    schedules += _thin(dp.frontier(chain), points)
    schedules += _thin(dp.frontier(chain, selective=True, name="auto"), points)
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
                }
            )
        out.append(point)
    return out


def terminal_plot(points: Sequence[SweepPoint], width: int = 64, height: int = 16) -> str:
    """A scatter of overhead (up) against peak (right), one letter per strategy."""
    measured = all(p.measured_peak_bytes is not None for p in points)

    def xy(p: SweepPoint) -> tuple[float, float]:
        if measured:
            return float(p.measured_peak_bytes or 0), float(p.measured_overhead or 0.0)
        return float(p.predicted_peak_bytes), p.predicted_overhead

    coords = [xy(p) for p in points]
    xs, ys = [c[0] for c in coords], [c[1] for c in coords]
    x0, x1 = min(xs), max(xs) or 1.0
    y0, y1 = min(0.0, min(ys)), max(ys) or 1.0
    grid = [[" "] * width for _ in range(height)]
    letters: dict[str, str] = {}
    for p, (x, y) in zip(points, coords, strict=True):
        family = p.strategy.split("-")[0] if p.strategy.startswith("every") else p.strategy
        letter = letters.setdefault(family, "NFSEDA"[len(letters) % 6])
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
        family = "every-k" if p.strategy.startswith("every") else p.strategy
        families.setdefault(family, []).append(p)
    for family, members in families.items():
        measured = all(m.measured_peak_bytes is not None for m in members)
        xs = [
            (m.measured_peak_bytes if measured else m.predicted_peak_bytes) / 2**30 for m in members
        ]
        ys = [
            100 * ((m.measured_overhead if measured else m.predicted_overhead) or 0.0)
            for m in members
        ]
        style = "-o" if family in ("dp", "auto") else "s"
        axes.plot(xs, ys, style, label=family)
    axes.set_xlabel("peak memory of a step (GiB)")
    axes.set_ylabel("step-time overhead (%)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
