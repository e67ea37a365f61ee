"""Rich renderings of plans, verifications, sweeps and the op-graph gap; everything shown of a
plan comes from the plan file (``ckptplan.cli.profile_report`` shows profiles)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from ckptplan.cli.regions import regions_words, tensors_words
from ckptplan.profiling.describe import describe_units
from ckptplan.values.plan import Plan
from ckptplan.values.policy_types import Choice
from ckptplan.values.prediction import Prediction
from ckptplan.wording import SPREAD_NOTE, ByteUnit, batch_words, percent, ratio, with_spread


def _regions_text(plan: Plan) -> str:
    return regions_words(plan.regions) if plan.regions else "none (every activation kept)"


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
        batch_words(s.batch_size, plan.inputs),
        f"optimizer {s.optimizer}",
        ranks,
        f"scope {plan.budget.scope}",
        "op times measured here" if s.measure else f"op times from the {target} roofline",
    ]
    if s.blocks:
        parts.append(f"blocks {s.blocks!r}")
    return "made for: " + " · ".join(parts)


def _overhead(prediction: Prediction) -> str:
    return percent(prediction.overhead)


def show_plan(plan: Plan, console: Console) -> None:
    """The plan, its prediction by category, and the baselines at a glance; every memory
    figure in the unit of the largest (``wording.ByteUnit``)."""
    p = plan.predicted
    budget = plan.budget
    baselines = [(name, Prediction.from_json(b)) for name, b in plan.baselines.items()]
    size = ByteUnit.of(budget.bytes, p.peak_bytes, *(b.peak_bytes for _, b in baselines))
    console.print(
        f"[bold]ckptplan[/] · {plan.model} ({plan.fingerprint['class']}, "
        f"{plan.fingerprint['parameters']:,} parameters) · {len(plan.blocks)} blocks · "
        f"solver [bold]{plan.solver}[/]"
    )
    console.print(
        f"budget [bold]{size(budget.bytes)}[/] ({budget.text}, scope {budget.scope}) · "
        f"predicted peak [bold]{size(p.peak_bytes)}[/] at {p.peak_event} · recompute "
        f"{_overhead(p)} of step time (estimated)"
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
    if budget.margin_percent and budget.aim_bytes is not None:
        console.print(
            f"margin: {budget.margin_percent:g}% of the budget held back (--margin); the plan "
            f"aims at {size(budget.aim_bytes)}"
        )
    if plan.settings.compiled and p.compiled_partition is not None:
        console.print(
            "for torch.compile (ckptplan.apply, then torch.compile): inductor's partition, made "
            f"on fake tensors, hands {size(p.compiled_partition['saved_bytes'])} "
            "to backward; the budget holds the compiled step's peak below"
        )
        partition = p.compiled_partition
        added = [
            f"{partition[name] - partition[f'unchecked_{name}']} {words}"
            for name, words in (("compiled_graphs", "graphs"), ("graph_breaks", "graph breaks"))
            if partition.get(name, 0) > partition.get(f"unchecked_{name}", partition.get(name, 0))
        ]
        if added:
            console.print(
                f"[bold yellow]under torch.compile the plan adds {' and '.join(added)}[/] to "
                "the unchecked step's, in its fake run: the code after a break runs eagerly "
                "(verify measures both)"
            )
        if "unchecked_seconds" in partition:
            console.print(
                f"its graphs priced kernel by kernel on the {plan.settings.device} roofline: "
                f"{1e3 * partition['seconds']:.1f} ms against the unchecked compiled step's "
                f"{1e3 * partition['unchecked_seconds']:.1f} ms (the predicted recompute)"
            )
    if p.fake_run_peak_bytes is not None:
        over = p.fake_run_peak_bytes > budget.bytes
        console.print(
            f"fake-run check (the checkpointed step executed on fake tensors): peak "
            f"[bold]{size(p.fake_run_peak_bytes)}[/]"
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
        offloaded = [c for r in plan.regions if r.policy for c in r.policy.calls(Choice.OFFLOAD)]
        console.print(
            f"offloaded to host memory (pinned) at the end of forward: "
            f"[bold]{size(p.offloaded_bytes)}[/], {tensors_words(offloaded)}; the transfers "
            "are counted in the recompute time"
        )
    parts = Table(title="predicted peak by category", show_header=True, box=None)
    for column in ("parameters", "gradients", "optimizer", "batch", "activations", "total"):
        parts.add_column(column, justify="right")
    parts.add_row(
        *(
            size(n)
            for n in (p.parameters, p.gradients, p.optimizer, p.inputs, p.activations, p.peak_bytes)
        )
    )
    console.print(parts)
    if baselines:
        table = Table(title="against fixed policies (predicted)")
        table.add_column("strategy")
        table.add_column("peak", justify="right")
        table.add_column("recompute", justify="right")
        table.add_column("fits budget", justify="center")
        for name, prediction in [*baselines, (f"{plan.solver} (this plan)", p)]:
            fits = "✓" if prediction.peak_bytes <= budget.bytes else "✗"
            table.add_row(name, size(prediction.peak_bytes), _overhead(prediction), fits)
        console.print(table)


def _agreement(a: str, b: str, exact: bool) -> str:
    """``=`` beside figures equal to the byte, ``≈`` beside figures that differ by less than
    they show (never ``≠`` beside two identical figures), ``≠`` beside figures that differ."""
    return "=" if exact else "≈" if a == b else "≠"


def show_verification(result: Any, console: Console) -> None:
    """Measured against predicted, with a verdict per check; memory in one unit, measured
    times with their spread."""
    table = Table(title=f"verify on {result.device}")
    table.add_column("check")
    table.add_column("value", justify="right")
    table.add_column("", justify="center")
    fits = result.measured_peak_bytes <= result.budget_bytes
    instrument = "CUDA allocator" if result.device.startswith("cuda") else "CPU allocator"
    compiled = result.compiled
    size = ByteUnit.of(
        result.budget_bytes,
        result.measured_peak_bytes,
        result.baseline_peak_bytes,
        result.predicted_peak_bytes,
        result.tracked_peak_bytes,
        compiled.unchecked_peak_bytes if compiled else None,
    )
    measured = size(result.measured_peak_bytes)
    table.add_row("budget", size(result.budget_bytes), "")
    table.add_row(f"measured peak ({instrument})", measured, "✓" if fits else "✗")
    if result.tracked_peak_bytes is not None:
        tracked = size(result.tracked_peak_bytes)
        exact = result.tracked_peak_bytes == result.measured_peak_bytes
        table.add_row("peak by ckptplan's tracker", tracked, _agreement(tracked, measured, exact))
    predicted = size(result.predicted_peak_bytes)
    table.add_row("predicted peak", f"{predicted} ({100 * result.prediction_error:.1f}% off)", "")
    kind = " (eager)" if compiled else ""
    bounds = result.step_time_ratio_range
    table.add_row(f"unchecked peak{kind}", size(result.baseline_peak_bytes), "")
    table.add_row(
        f"step time / unchecked{kind}", with_spread(result.step_time_ratio, bounds, ratio), ""
    )
    if compiled:
        table.add_row("unchecked peak (compiled)", size(compiled.unchecked_peak_bytes), "")
        table.add_row(
            "step time / unchecked (compiled)",
            f"{ratio(compiled.step_time_ratio)} (a quotient of medians: no spread)",
            "",
        )
        table.add_row("compile time (apart)", f"{compiled.compile_time_s:.1f} s", "")
    if result.predicted_overhead is not None:
        overhead = (
            percent(result.measured_overhead)
            if compiled
            else with_spread(result.measured_overhead, (bounds[0] - 1, bounds[1] - 1), percent)
        )
        table.add_row(
            "overhead: predicted / measured",
            f"{percent(result.predicted_overhead)} / {overhead}",
            "" if result.overhead_agrees else "differ by >25%",
        )
    table.add_row(
        "max |grad difference|",
        f"{result.max_grad_abs_diff:.2e}",
        "✓" if result.grads_match else "✗",
    )
    console.print(table)
    console.print(f"[dim]{SPREAD_NOTE}[/]")


def show_sweep(result: Any, console: Console, budget: int | None = None) -> None:
    """Every point, predicted beside measured (with its spread), in one unit; with a budget,
    which fit it."""
    table = Table(title=f"{result.model}, every strategy: peak against recompute overhead")
    columns = ["strategy", "regions", "predicted peak", "predicted overhead"]
    peaks = [budget] + [
        b for p in result.points for b in (p.predicted_peak_bytes, p.measured_peak_bytes)
    ]
    size = ByteUnit.of(*peaks)
    if result.measured:
        columns += ["measured peak", "measured overhead", "grad diff"]
    if budget is not None:
        columns.append(f"fits {size(budget)}")
    for column in columns:
        table.add_column(column, justify="left" if column == "strategy" else "right")

    def shown(n: float | None, words: Callable[[float], str] = size) -> str:
        return "" if n is None else words(n)

    for p in result.points:
        row = [p.strategy, str(p.regions), shown(p.predicted_peak_bytes)]
        row.append(shown(p.predicted_overhead, percent))
        if result.measured:
            diff = "" if p.max_grad_abs_diff is None else f"{p.max_grad_abs_diff:.0e}"
            overhead = (
                with_spread(p.measured_overhead, p.measured_overhead_range, percent)
                if p.measured_overhead is not None and p.measured_overhead_range
                else shown(p.measured_overhead, percent)
            )
            row += [shown(p.measured_peak_bytes), overhead, diff]
        if budget is not None:
            judged = p.measured_peak_bytes if result.measured else p.predicted_peak_bytes
            row.append("" if judged is None else "✓" if judged <= budget else "✗")
        table.add_row(*row)
    console.print(table)
    console.print(f"[dim]{result.caption()}[/]")  # with what the spread is


def show_gap(report: Any, console: Console) -> None:
    """Auto's plan against the op-graph optimum, in seconds of recompute."""
    unit = report.time_unit
    console.print(
        f"[bold]{report.model}[/]: {report.n_ops} ops ({report.n_nodes} nodes, "
        f"{report.n_edges} edges); one step computes for {report.total_cost * unit:.4g} s"
    )
    budget = ByteUnit.of(report.budget)(report.budget)
    table = Table(title=f"at the op-graph peak of auto's plan, {budget}")
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
    size = ByteUnit.of(result.budget_bytes, *(p.peak_bytes for p in result.points))
    table = Table(title=f"{result.vary} sizes against the budget {size(result.budget_bytes)}")
    for column in (result.vary, "fits", "peak", "plan", "overhead", unit):
        table.add_column(column, justify="left" if column == "plan" else "right")
    for p in result.points:
        table.add_row(
            str(p.size),
            "✓" if p.fits else "✗",
            size(p.peak_bytes) + ("" if p.fits else " least"),
            p.regions,
            "" if p.overhead is None else percent(p.overhead),
            "" if p.throughput is None else f"{p.throughput:.4g}",
        )
    console.print(table)
    console.print(f"largest {result.vary} that fits: [bold]{result.largest}[/]")
    console.print(f"recommended: [bold]{result.recommended}[/] ({result.reason})")
    console.print(
        "[dim]throughput and overhead are predicted (the target's roofline); peaks are the "
        "plans' predicted peaks, each confirmed on fake tensors[/]"
    )
