"""The plot of ``benchmarks/compile.py``'s results: measured peak against step time, per model."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(results: dict[str, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted(results)
    fig, axes = plt.subplots(1, len(models), figsize=(4 * len(models), 3.6), squeeze=False)
    styles = {
        "compile": ("^", "tab:red"),
        "ckptplan": ("o", "tab:blue"),
        "eager": ("s", "tab:gray"),
    }
    for ax, model in zip(axes[0], models, strict=True):
        for row in results[model]:
            if "peak_bytes" not in row:
                continue
            family = row["strategy"].split("-")[0]
            marker, colour = styles.get(family, ("x", "black"))
            ax.scatter(row["peak_bytes"] / 2**20, row["time_vs_eager"], marker=marker, c=colour)
        ax.set_title(model)
        ax.set_xlabel("measured peak (MiB, CPU allocator)")
        ax.set_ylabel("step time / eager unchecked")
    handles = [
        plt.Line2D([], [], marker=m, color=c, linestyle="", label=label)
        for label, (m, c) in (
            ("torch.compile memory budget", styles["compile"]),
            ("ckptplan --compile", styles["ckptplan"]),
            ("eager (unchecked, auto, dp)", styles["eager"]),
        )
    ]
    fig.legend(handles=handles, loc="lower center", ncol=3)
    fig.suptitle("Measured peak and step time, CPU, one thread, dropout on")
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(path)
