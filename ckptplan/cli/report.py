"""Rich renderings of plans, verifications, sweeps and the op-graph gap; everything shown of a
plan comes from the plan file (``ckptplan.cli.profile_report`` shows profiles)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from ckptplan.budget import format_bytes
from ckptplan.plan import Plan
from ckptplan.prediction import Prediction
from ckptplan.profiling.describe import describe_regions, describe_units


def _regions_text(plan: Plan) -> str:
    return describe_regions(plan.regions) if plan.regions else "none (every activation kept)"


def _batch(plan: Plan) -> str:
    """The batch the plan was made for: the flag, or the leading size of the model's inputs."""
    if plan.settings.batch_size:
        return f"batch {plan.settings.batch_size}"
    sizes = {shape[0] for shape, _ in _input_shapes(plan.inputs) if shape}
    return f"batch {sizes.pop()} (the model's)" if len(sizes) == 1 else "the model's own batch"


def _input_shapes(inputs: Any) -> list[tuple[list[int], str]]:
    """``[shape, dtype]`` leaves of a plan's recorded inputs."""
    if (
        isinstance(inputs, list | tuple)
        and len(inputs) == 2
        and isinstance(inputs[0], list | tuple)
        and all(isinstance(d, int) for d in inputs[0])
        and str(inputs[1]).startswith("torch.")
    ):
        return [(list(inputs[0]), inputs[1])]
    if isinstance(inputs, dict):
        inputs = list(inputs.values())
    if isinstance(inputs, list | tuple):
        return [leaf for item in inputs for leaf in _input_shapes(item)]
    return []


def settings_line(plan: Plan) -> str:
    """What the plan assumed: target, precision, batch, optimizer, parallelism, scope."""
    s = plan.settings
    target = s.device
    precision = s.dtype
    if s.autocast:
        precision += f" weights, forward under autocast {s.autocast}"
    parallel = s.parallel
    ranks = f"{parallel} over {s.world_size} ranks (figures per rank)" if parallel else "one device"
    parts = [
        f"target {target}",
        precision,
        _batch(plan),
        f"optimizer {s.optimizer}",
        ranks,
        f"scope {plan.budget.scope}",
        "op times measured here" if s.measure else f"op times from the {target} roofline",
    ]
    if s.blocks:
        parts.append(f"blocks {s.blocks!r}")
    return "made for: " + " · ".join(parts)


def _overhead(prediction: Prediction) -> str:
    return f"+{100 * prediction.overhead:.1f}%"


def show_plan(plan: Plan, console: Console) -> None:
    """The plan, its prediction by category, and the baselines at a glance."""
    p = plan.predicted
    budget = plan.budget
    console.print(
        f"[bold]ckptplan[/] · {plan.model} ({plan.fingerprint['class']}, "
        f"{plan.fingerprint['parameters']:,} parameters) · {len(plan.blocks)} blocks · "
        f"solver [bold]{plan.solver}[/]"
    )
    largest = max(budget.bytes, p.peak_bytes)
    console.print(
        f"budget [bold]{format_bytes(budget.bytes, largest)}[/] ({budget.text}, scope "
        f"{budget.scope}) · predicted peak [bold]{format_bytes(p.peak_bytes, largest)}[/]"
        f" at {p.peak_event} · recompute {_overhead(p)} of step time (estimated)"
    )
    console.print(settings_line(plan))
    device = plan.settings.device
    console.print(
        "the budget is held against "
        + (
            "the CPU allocator's live bytes (as verify measures them)"
            if device == "cpu"
            else f"torch.cuda.max_memory_allocated on the {device} (512-byte blocks; the CUDA "
            "context and reserved-but-free blocks are outside it, the cuBLAS workspace in the "
            "margin)"
        )
    )
    if budget.margin_percent:
        console.print(
            f"margin: {budget.margin_percent:g}% of the budget held back (--margin); the plan "
            f"aims at {format_bytes(budget.aim_bytes)}"
        )
    if plan.settings.compiled and p.compiled_partition is not None:
        console.print(
            "for torch.compile (ckptplan.apply, then torch.compile): inductor's partition, made "
            f"on fake tensors, hands {format_bytes(p.compiled_partition['saved_bytes'])} "
            "to backward; the budget holds the compiled step's peak below"
        )
    if p.fake_run_peak_bytes is not None:
        over = p.fake_run_peak_bytes > budget.bytes
        console.print(
            f"fake-run check (the checkpointed step executed on fake tensors): peak "
            f"[bold]{format_bytes(p.fake_run_peak_bytes)}[/]"
            + (
                " [bold red]exceeds the budget[/]: lower --budget or try another --solver"
                if over
                else ""
            )
        )
    console.print(
        f"units, in execution order: {describe_units(list(plan.blocks), [''] * len(plan.blocks))}"
    )
    for note in plan.settings.notes:
        console.print(f"note: {note}")
    console.print(f"checkpointed regions ({len(plan.regions)}): {_regions_text(plan)}")
    if p.offloaded_bytes:
        console.print(
            f"offloaded to host memory (pinned): [bold]{format_bytes(p.offloaded_bytes)}[/] "
            "at the end of forward; its transfers are counted in the recompute time"
        )
    parts = Table(title="predicted peak by category", show_header=True, box=None)
    for column in ("parameters", "gradients", "optimizer", "batch", "activations", "total"):
        parts.add_column(column, justify="right")
    parts.add_row(
        *(
            format_bytes(n, p.peak_bytes)
            for n in (p.parameters, p.gradients, p.optimizer, p.inputs, p.activations, p.peak_bytes)
        )
    )
    console.print(parts)
    if plan.baselines:
        table = Table(title="against fixed policies (predicted)")
        table.add_column("strategy")
        table.add_column("peak", justify="right")
        table.add_column("recompute", justify="right")
        table.add_column("fits budget", justify="center")
        rows = [(name, Prediction.from_json(b)) for name, b in plan.baselines.items()]
        rows.append((f"{plan.solver} (this plan)", p))
        like = max(prediction.peak_bytes for _, prediction in rows)
        for name, prediction in rows:
            fits = "✓" if prediction.peak_bytes <= budget.bytes else "✗"
            peak = format_bytes(prediction.peak_bytes, like)
            table.add_row(name, peak, _overhead(prediction), fits)
        console.print(table)


def show_verification(result: Any, console: Console) -> None:
    """Measured against predicted, with a verdict per check."""
    table = Table(title=f"verify on {result.device}")
    table.add_column("check")
    table.add_column("value", justify="right")
    table.add_column("", justify="center")
    fits = result.measured_peak_bytes <= result.budget_bytes
    instrument = "CUDA allocator" if result.device.startswith("cuda") else "CPU allocator"
    like = max(result.budget_bytes, result.measured_peak_bytes, result.baseline_peak_bytes)
    table.add_row("budget", format_bytes(result.budget_bytes, like), "")
    table.add_row(
        f"measured peak ({instrument})",
        format_bytes(result.measured_peak_bytes, like),
        "✓" if fits else "✗",
    )
    if result.tracked_peak_bytes is not None:
        same = result.tracked_peak_bytes == result.measured_peak_bytes
        table.add_row(
            "peak by ckptplan's tracker",
            format_bytes(result.tracked_peak_bytes, like),
            "=" if same else "≠",
        )
    predicted = format_bytes(result.predicted_peak_bytes, like)
    table.add_row("predicted peak", f"{predicted} ({100 * result.prediction_error:.1f}% off)", "")
    compiled = result.compiled
    kind = " (eager)" if compiled else ""
    table.add_row(f"unchecked peak{kind}", format_bytes(result.baseline_peak_bytes, like), "")
    table.add_row(f"step time / unchecked{kind}", f"{result.step_time_ratio:.2f}x", "")
    if compiled:
        unchecked = format_bytes(compiled.unchecked_peak_bytes, like)
        table.add_row("unchecked peak (compiled)", unchecked, "")
        table.add_row("step time / unchecked (compiled)", f"{compiled.step_time_ratio:.2f}x", "")
        table.add_row("compile time (apart)", f"{compiled.compile_time_s:.1f} s", "")
    if result.predicted_overhead is not None:
        measured = result.measured_overhead
        table.add_row(
            "overhead: predicted / measured",
            f"+{100 * result.predicted_overhead:.0f}% / +{100 * measured:.0f}%",
            "" if result.overhead_agrees else "differ by >25%",
        )
    table.add_row(
        "max |grad difference|",
        f"{result.max_grad_abs_diff:.2e}",
        "✓" if result.grads_match else "✗",
    )
    console.print(table)


def show_sweep(result: Any, console: Console, budget: int | None = None) -> None:
    """Every point, predicted beside measured, in one unit; with a budget, which fit it."""
    table = Table(title=f"{result.model}, every strategy: peak against recompute overhead")
    columns = ["strategy", "regions", "predicted peak", "predicted overhead"]
    if result.measured:
        columns += ["measured peak", "measured overhead", "grad diff"]
    if budget is not None:
        columns.append(f"fits {format_bytes(budget)}")
    for column in columns:
        table.add_column(column, justify="left" if column == "strategy" else "right")
    peaks = [
        b
        for p in result.points
        for b in (p.predicted_peak_bytes, p.measured_peak_bytes, budget)
        if b is not None
    ]
    like = max(peaks, default=0)

    def size(n: int | None) -> str:
        return "" if n is None else format_bytes(n, like)

    def percent(x: float | None) -> str:
        return "" if x is None else f"{100 * x:.1f}%"

    for p in result.points:
        row = [p.strategy, str(p.regions), size(p.predicted_peak_bytes)]
        row.append(percent(p.predicted_overhead))
        if result.measured:
            diff = "" if p.max_grad_abs_diff is None else f"{p.max_grad_abs_diff:.0e}"
            row += [size(p.measured_peak_bytes), percent(p.measured_overhead), diff]
        if budget is not None:
            judged = p.measured_peak_bytes if result.measured else p.predicted_peak_bytes
            row.append("" if judged is None else "✓" if judged <= budget else "✗")
        table.add_row(*row)
    console.print(table)
    console.print(f"[dim]{result.caption()}[/]")


def show_gap(report: Any, console: Console) -> None:
    """Auto's plan against the op-graph optimum, in seconds of recompute."""
    unit = report.time_unit
    console.print(
        f"[bold]{report.model}[/]: {report.n_ops} ops ({report.n_nodes} nodes, "
        f"{report.n_edges} edges); one step computes for {report.total_cost * unit:.4g} s"
    )
    table = Table(title=f"at the op-graph peak of auto's plan, {format_bytes(report.budget)}")
    for column in ("solver", "recompute (s)", "step (s)", "status"):
        table.add_column(column, justify="left" if column in ("solver", "status") else "right")
    table.add_row(
        "auto", f"{report.auto_recompute * unit:.4g}", f"{report.auto_cost * unit:.4g}", ""
    )
    if report.ilp_cost is None:
        table.add_row("ilp", "-", "-", f"{report.ilp_status}: {report.ilp_reason}")
    else:
        table.add_row(
            "ilp",
            f"{(report.ilp_recompute or 0) * unit:.4g}",
            f"{report.ilp_cost * unit:.4g}",
            f"{report.ilp_status} ({report.ilp_seconds:.1f} s): {report.ilp_reason}",
        )
    console.print(table)
    if report.gap is not None:
        proof = "proven optimum" if report.proven else "best ILP schedule found"
        console.print(
            f"auto's step is {100 * report.gap:.2f}% longer than the {proof}"
            + (
                f"; {100 * report.bound_gap:.2f}% above the ILP's lower bound"
                if report.bound_gap is not None
                else ""
            )
        )


def show_fit(result: Any, console: Console) -> None:
    """Every size ``fit`` asked: its plan's peak (or the least peak that refused it), the plan
    in brief, the predicted overhead and throughput; then the answer and why."""
    unit = "samples/s" if result.vary == "batch" else "tokens/s"
    budget = format_bytes(result.budget_bytes)
    table = Table(title=f"{result.vary} sizes against the budget {budget}")
    for column in (result.vary, "fits", "peak", "plan", "overhead", unit):
        table.add_column(column, justify="left" if column == "plan" else "right")
    like = result.budget_bytes
    for p in result.points:
        table.add_row(
            str(p.size),
            "✓" if p.fits else "✗",
            format_bytes(p.peak_bytes, like) + ("" if p.fits else " least"),
            p.regions,
            "" if p.overhead is None else f"+{100 * p.overhead:.1f}%",
            "" if p.throughput is None else f"{p.throughput:.4g}",
        )
    console.print(table)
    console.print(f"largest {result.vary} that fits: [bold]{result.largest}[/]")
    console.print(f"recommended: [bold]{result.recommended}[/] ({result.reason})")
    console.print(
        "[dim]throughput and overhead are predicted (the target's roofline); peaks are the "
        "plans' predicted peaks, each confirmed on fake tensors[/]"
    )
