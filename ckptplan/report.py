"""Rich renderings of plans and verifications; everything shown comes from the plan file."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from ckptplan.budget import format_bytes
from ckptplan.plan import Plan


def _regions_text(plan: Plan) -> str:
    if not plan.regions:
        return "none (every activation kept)"
    names = []
    for region in plan.regions:
        first, last = region.modules[0], region.modules[-1]
        names.append(first if first == last else f"{first} … {last}")
    return ", ".join(names)


def _overhead(prediction: dict[str, Any]) -> str:
    return f"+{100 * prediction['overhead']:.1f}%"


def show_plan(plan: Plan, console: Console) -> None:
    """The plan, its prediction by category, and the baselines at a glance."""
    p = plan.predicted
    budget = plan.budget
    console.print(
        f"[bold]ckptplan[/] · {plan.model} ({plan.fingerprint['class']}, "
        f"{plan.fingerprint['parameters']:,} parameters) · {len(plan.blocks)} blocks · "
        f"solver [bold]{plan.solver}[/]"
    )
    console.print(
        f"budget [bold]{budget['bytes'] / 2**30:.3g} GiB[/] ({budget['text']}, scope "
        f"{budget['scope']}) · predicted peak [bold]{format_bytes(p['peak_bytes'])}[/] at "
        f"{p['peak_event']} · recompute {_overhead(p)} of step time (estimated)"
    )
    console.print(f"checkpointed regions ({len(plan.regions)}): {_regions_text(plan)}")
    parts = Table(title="predicted peak by category", show_header=True, box=None)
    for column in ("parameters", "gradients", "optimizer", "batch", "activations", "total"):
        parts.add_column(column, justify="right")
    parts.add_row(
        *(format_bytes(p[k]) for k in ("parameters", "gradients", "optimizer", "inputs")),
        format_bytes(p["activations"]),
        format_bytes(p["peak_bytes"]),
    )
    console.print(parts)
    if plan.baselines:
        table = Table(title="against fixed policies (predicted)")
        table.add_column("strategy")
        table.add_column("peak", justify="right")
        table.add_column("recompute", justify="right")
        table.add_column("fits budget", justify="center")
        rows = [*plan.baselines.items(), (f"{plan.solver} (this plan)", p)]
        for name, prediction in rows:
            fits = "✓" if prediction["peak_bytes"] <= budget["bytes"] else "✗"
            table.add_row(name, format_bytes(prediction["peak_bytes"]), _overhead(prediction), fits)
        console.print(table)


def show_verification(result: Any, console: Console) -> None:
    """Measured against predicted, with a verdict per check."""
    table = Table(title=f"verify on {result.device}")
    table.add_column("check")
    table.add_column("value", justify="right")
    table.add_column("", justify="center")
    fits = result.measured_peak_bytes <= result.budget_bytes
    table.add_row("budget", f"{result.budget_bytes / 2**30:.3g} GiB", "")
    table.add_row("measured peak", format_bytes(result.measured_peak_bytes), "✓" if fits else "✗")
    table.add_row(
        "predicted peak",
        f"{format_bytes(result.predicted_peak_bytes)} ({100 * result.prediction_error:.1f}% off)",
        "",
    )
    table.add_row("unchecked peak", format_bytes(result.baseline_peak_bytes), "")
    table.add_row("step time ratio", f"{result.step_time_ratio:.2f}x", "")
    table.add_row(
        "max |grad difference|",
        f"{result.max_grad_abs_diff:.2e}",
        "✓" if result.grads_match else "✗",
    )
    console.print(table)
