"""The frontier of a sweep (``ckptplan.verifying.sweep``) drawn: a scatter for the terminal
and a matplotlib figure (PNG or SVG), each strategy in its own marker, auto's best plan within
the budget marked, measured points with the spread of their timed runs."""

from __future__ import annotations

from typing import Any

from ckptplan.errors import CkptplanError
from ckptplan.verifying.sweep import Sweep, SweepPoint
from ckptplan.wording import ByteUnit


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


def chosen_point(result: Sweep, budget: int | None) -> SweepPoint | None:
    """Auto's plan of least predicted overhead within ``budget`` (predicted peak): the point
    the plot and the terminal plot mark; None without a budget or where none fits."""
    if budget is None:
        return None
    fitting = [
        p
        for p in result.points
        if p.strategy == "auto" and (p.predicted_peak_bytes or budget + 1) <= budget
    ]
    return min(fitting, key=lambda p: (p.predicted_overhead or 0.0, p.regions), default=None)


CHOSEN_LABEL = "auto's best plan within the budget"


def terminal_plot(
    result: Sweep, budget: int | None = None, width: int = 64, height: int = 16
) -> str:
    """A scatter of overhead (up) against peak (right), one letter per strategy and ``*`` at
    auto's best plan within the budget; measured figures where the sweep measured them, and
    ``┊`` at the budget (``show_sweep`` prints the settings above it)."""
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
    chosen = chosen_point(result, budget)
    letters: dict[str, str] = {}
    for p, (x, y) in coords:
        letter = letters.setdefault(_family(p.strategy), "NFSEDAC"[len(letters) % 7])
        up = round((y - y0) / ((y1 - y0) or 1) * (height - 1))
        grid[height - 1 - up][column(x)] = "*" if p is chosen else letter
    what = f"measured on {result.measured_on}" if result.measured else "predicted"
    unit = ByteUnit.of(x1)
    lines = [f"recompute overhead, {what}: up to {100 * y1:.0f}% ┐"]
    lines += ["│" + "".join(r) for r in grid]
    span = f"{x0 / unit.size:.3g}…{x1 / unit.size:.3g} {unit.name}"
    lines.append("└" + "─" * width + f" peak, {what}: {span}")
    legend = "  ".join(f"{v}={k}" for k, v in letters.items())
    legend += f"  *={CHOSEN_LABEL}" if chosen else ""
    lines.append(legend + (f"  ┊=budget {unit(budget)}" if budget else ""))
    return "\n".join(lines)


_STYLES = {
    "none": ("X", 10, 5),
    "full": ("s", 8, 4),
    "sqrt": ("D", 8, 4),
    "every-k": ("v", 8, 4),
    "compile": ("P", 8, 4),
    "dp": ("o", 5, 3),
    "auto": ("^", 11, 2),
}
"""Family -> (marker, size, z-order): each family its own marker; where points coincide (none
and dp lie on auto's frontier) the smaller ones are drawn over auto's larger ones."""
_FRONTIER_LINES = {"dp": ":", "auto": "-"}


def sweep_figure(result: Sweep, budget: int | None = None) -> Any:
    """The frontier as a matplotlib figure: predicted figures hollow, measured ones filled
    with bars from the least to the greatest overhead of their timed runs; auto's best plan
    within the budget starred; the budget a vertical line; the settings as the caption."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peaks = [p.predicted_peak_bytes or p.measured_peak_bytes or 0 for p in result.points]
    unit = ByteUnit.of(*peaks, budget)
    figure, axes = plt.subplots(figsize=(9.5, 5))
    families: dict[str, list[SweepPoint]] = {}
    for p in result.points:
        families.setdefault(_family(p.strategy), []).append(p)
    for index, (family, members) in enumerate(families.items()):
        color = f"C{index}"
        marker, size, zorder = _STYLES.get(family, ("*", 8, 4))
        for measured in (False, True) if result.measured else (False,):
            points = sorted(
                ((m, xy) for m in members if (xy := _xy(m, measured)) is not None),
                key=lambda pair: pair[1],
            )
            if not points:
                continue
            xs = [x / unit.size for _, (x, _) in points]
            ys = [100 * y for _, (_, y) in points]
            axes.plot(
                xs,
                ys,
                marker=marker,
                markersize=size,
                linestyle=_FRONTIER_LINES.get(family, ""),
                linewidth=2 if measured else 1,
                color=color,
                markerfacecolor=color if measured else "none",
                zorder=zorder,
                label=f"{family}, {'measured' if measured else 'predicted'}",
            )
            bounds = [m.measured_overhead_range for m, _ in points]
            if measured and all(bounds):
                below = [y - 100 * b[0] for y, b in zip(ys, bounds, strict=True) if b]
                above = [100 * b[1] - y for y, b in zip(ys, bounds, strict=True) if b]
                axes.errorbar(
                    xs,
                    ys,
                    yerr=[below, above],
                    fmt="none",
                    ecolor=color,
                    capsize=3,
                    zorder=zorder,
                    label=f"_{family}, measured spread",  # "_": not in the legend
                )
    chosen = chosen_point(result, budget)
    if chosen is not None:
        stars = [xy for measured in (False, True) if (xy := _xy(chosen, measured)) is not None]
        axes.plot(
            [x / unit.size for x, _ in stars],
            [100 * y for _, y in stars],
            marker="*",
            markersize=18,
            linestyle="",
            color="gold",
            markeredgecolor="black",
            zorder=6,
            label=CHOSEN_LABEL,
        )
    if budget:
        axes.axvline(budget / unit.size, color="red", linestyle=":", label=f"budget {unit(budget)}")
    what = f"measured on {result.measured_on} and predicted" if result.measured else "predicted"
    axes.set_xlabel(f"peak memory of one training step ({unit.name})")
    axes.set_ylabel("recompute overhead (% of the unchecked step time)")
    axes.set_title(f"{result.model}: overhead against peak memory, {what}")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # off the points
    figure.text(0.01, 0.01, result.caption(), fontsize=7, wrap=True)
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    return figure


def save_plot(result: Sweep, path: str, budget: int | None = None) -> None:
    """``sweep_figure`` as PNG or SVG by the file's suffix; needs matplotlib (``pip install
    'ckptplan[plot]'``)."""
    try:
        import matplotlib
    except ImportError:
        raise CkptplanError(
            "plotting needs matplotlib: pip install 'ckptplan[plot]' (or drop --plot)"
        ) from None
    figure = sweep_figure(result, budget)
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.fonttype": "none"}):  # an SVG's words stay text, for a report
        figure.savefig(path)
    plt.close(figure)
