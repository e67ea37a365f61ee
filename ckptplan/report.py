"""Rich renderings of plans and verifications; everything shown comes from the plan file."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from ckptplan.budget import format_bytes
from ckptplan.plan import Plan
from ckptplan.units import describe_regions, describe_units


def _regions_text(plan: Plan) -> str:
    return describe_regions(plan.regions) if plan.regions else "none (every activation kept)"


def _batch(plan: Plan) -> str:
    """The batch the plan was made for: the flag, or the leading size of the model's inputs."""
    if plan.settings.get("batch_size"):
        return f"batch {plan.settings['batch_size']}"
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
    target = s.get("device", "cpu")
    precision = s.get("dtype", "fp32")
    if s.get("autocast"):
        precision += f" weights, forward under autocast {s['autocast']}"
    parallel = s.get("parallel")
    ranks = (
        f"{parallel} over {s.get('world_size')} ranks (figures per rank)"
        if parallel
        else "one device"
    )
    parts = [
        f"target {target}",
        precision,
        _batch(plan),
        f"optimizer {s.get('optimizer', 'adamw')}",
        ranks,
        f"scope {plan.budget.get('scope', 'step')}",
        "op times measured here" if s.get("measure") else f"op times from the {target} roofline",
    ]
    if s.get("blocks"):
        parts.append(f"blocks {s['blocks']!r}")
    return "made for: " + " · ".join(parts)


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
    largest = max(budget["bytes"], p["peak_bytes"])
    console.print(
        f"budget [bold]{format_bytes(budget['bytes'], largest)}[/] ({budget['text']}, scope "
        f"{budget['scope']}) · predicted peak [bold]{format_bytes(p['peak_bytes'], largest)}[/]"
        f" at {p['peak_event']} · recompute {_overhead(p)} of step time (estimated)"
    )
    console.print(settings_line(plan))
    device = plan.settings.get("device", "cpu")
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
    if budget.get("margin_percent"):
        console.print(
            f"margin: {budget['margin_percent']:g}% of the budget held back (--margin); the plan "
            f"aims at {format_bytes(budget['aim_bytes'])}"
        )
    if plan.settings.get("compiled") and "compiled_partition" in p:
        console.print(
            "for torch.compile (ckptplan.apply, then torch.compile): inductor's partition, made "
            f"on fake tensors, hands {format_bytes(p['compiled_partition']['saved_bytes'])} "
            "to backward; the budget holds the compiled step's peak below"
        )
    if "fake_run_peak_bytes" in p:
        over = p["fake_run_peak_bytes"] > budget["bytes"]
        console.print(
            f"fake-run check (the checkpointed step executed on fake tensors): peak "
            f"[bold]{format_bytes(p['fake_run_peak_bytes'])}[/]"
            + (
                " [bold red]exceeds the budget[/]: lower --budget or try another --solver"
                if over
                else ""
            )
        )
    console.print(
        f"units, in execution order: {describe_units(list(plan.blocks), [''] * len(plan.blocks))}"
    )
    for note in plan.settings.get("notes", ()):
        console.print(f"note: {note}")
    console.print(f"checkpointed regions ({len(plan.regions)}): {_regions_text(plan)}")
    if p.get("offloaded_bytes"):
        console.print(
            f"offloaded to host memory (pinned): [bold]{format_bytes(p['offloaded_bytes'])}[/] "
            "at the end of forward; its transfers are counted in the recompute time"
        )
    parts = Table(title="predicted peak by category", show_header=True, box=None)
    for column in ("parameters", "gradients", "optimizer", "batch", "activations", "total"):
        parts.add_column(column, justify="right")
    parts.add_row(
        *(
            format_bytes(p[k], p["peak_bytes"])
            for k in ("parameters", "gradients", "optimizer", "inputs", "activations", "peak_bytes")
        )
    )
    console.print(parts)
    if plan.baselines:
        table = Table(title="against fixed policies (predicted)")
        table.add_column("strategy")
        table.add_column("peak", justify="right")
        table.add_column("recompute", justify="right")
        table.add_column("fits budget", justify="center")
        rows = [*plan.baselines.items(), (f"{plan.solver} (this plan)", p)]
        like = max(prediction["peak_bytes"] for _, prediction in rows)
        for name, prediction in rows:
            fits = "✓" if prediction["peak_bytes"] <= budget["bytes"] else "✗"
            peak = format_bytes(prediction["peak_bytes"], like)
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


def _at_depth(path: str, depth: int) -> str:
    return ".".join(path.split(".")[:depth]) if path else ""


def module_rows(profile: Any, depth: int) -> list[dict[str, Any]]:
    """Per-module totals at ``depth`` (module paths cut to that many parts), in run order."""
    classes = {path: (cls, params) for path, cls, params in profile.modules}
    rows: dict[str, dict[str, Any]] = {}
    for op in profile.ops:
        key = "(optimizer step)" if op.phase == "opt" else _at_depth(op.module, depth)
        row = rows.setdefault(
            key,
            {
                "module": key or "(model)",
                "class": classes.get(key, ("", 0))[0],
                "parameters": classes.get(key, ("", 0))[1],
                "saved_bytes": 0,
                "output_bytes": 0,
                "flops_fwd": 0.0,
                "flops_bwd": 0.0,
                "time_fwd_s": 0.0,
                "time_bwd_s": 0.0,
                "random_ops": 0,
            },
        )
        side = "bwd" if op.backward else "fwd"
        row["saved_bytes"] += op.saved_bytes
        if not op.backward:
            row["output_bytes"] += op.output_bytes
        row[f"flops_{side}"] += op.flops
        row[f"time_{side}_s"] += op.time
        row["random_ops"] += op.random and not op.backward
    return list(rows.values())


def _flops(n: float) -> str:
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f}"


def _seconds(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def show_profile(profile: Any, console: Console, depth: int = 2, top: int = 10) -> None:
    """What a step costs, by module, with the largest holders of memory for backward."""
    s = profile.settings
    console.print(
        f"[bold]ckptplan profile[/] · {profile.model_name} ({profile.fingerprint['class']}, "
        f"{profile.fingerprint['parameters']:,} parameters) · batch {s.batch_size or 'default'}"
        f" · {s.dtype}{' autocast ' + s.autocast if s.autocast else ''} · optimizer "
        f"{s.optimizer} · times {'measured here' if s.measure else 'estimated for ' + s.device}"
    )
    peak = profile.peak_bytes
    console.print(
        f"unchecked peak [bold]{format_bytes(peak)}[/] · persistent "
        f"{format_bytes(profile.persistent_bytes, peak)} (parameters "
        f"{format_bytes(profile.parameter_bytes, peak)}, optimizer "
        f"{format_bytes(profile.optimizer_bytes, peak)}, batch "
        f"{format_bytes(profile.input_bytes, peak)}) · {_flops(profile.flops)}FLOP · step "
        f"{_seconds(profile.step_time)} · a selective policy adds "
        f"{profile.policy_op_time * 1e6:.0f} µs per op call"
    )
    table = Table(title=f"by module (depth {depth})")
    for column in (
        "module",
        "class",
        "params",
        "saved for bwd",
        "fwd FLOP",
        "bwd FLOP",
        "fwd time",
        "bwd time",
    ):
        table.add_column(column, justify="left" if column in ("module", "class") else "right")
    rows = module_rows(profile, depth)
    like = max((row["saved_bytes"] for row in rows), default=0)
    for row in rows:
        table.add_row(
            row["module"],
            row["class"],
            f"{row['parameters']:,}",
            format_bytes(row["saved_bytes"], like),
            _flops(row["flops_fwd"]),
            _flops(row["flops_bwd"]),
            _seconds(row["time_fwd_s"]),
            _seconds(row["time_bwd_s"]),
        )
    console.print(table)
    timing = "measured on this machine" if profile.settings.measure else "roofline estimates"
    console.print(
        "[dim]saved for bwd: bytes autograd keeps for backward, made in the module's own "
        f"forward · FLOP, time: of its forward and of its backward ({timing} for "
        f"{profile.settings.device})[/]"
    )
    for note in profile.notes:
        console.print(f"note: {note}")
    units = describe_units([b.path for b in profile.blocks], [b.class_name for b in profile.blocks])
    console.print(f"planned units, in execution order: {units}")
    blocks = Table(title=f"the chain: {len(profile.blocks)} blocks")
    for column in ("block", "saved", "input kept", "fwd peak", "bwd peak", "joins", "flags"):
        blocks.add_column(column, justify="left" if column in ("block", "flags") else "right")
    like = max((max(b.fwd_peak, b.bwd_peak) for b in profile.blocks), default=0)
    for b in profile.blocks:
        flags = ", ".join(
            name
            for name, on in (
                ("random", b.random),
                ("updates buffers", b.stateful),
                ("code follows", b.gap is not None),
            )
            if on
        )
        blocks.add_row(
            b.path,
            format_bytes(b.saved_bytes, like),
            "yes" if b.input_kept else "no",
            format_bytes(b.fwd_peak, like),
            format_bytes(b.bwd_peak, like),
            "yes" if b.joins_previous else "no",
            flags,
        )
    console.print(blocks)
    console.print(
        "[dim]saved: bytes the block keeps for its backward beyond its input and output · "
        "input kept: the unchecked step holds the block's input until its backward · fwd/bwd "
        "peak: live bytes of the whole step at the peak of its forward and backward · joins: "
        "it may share a checkpoint region with the block before · flags: random (draws "
        "random numbers: recomputation replays the RNG), updates buffers (restored after "
        "recomputation), code follows (code runs between it and the next block)[/]"
    )
    holders = sorted((op for op in profile.ops if op.saved_bytes), key=lambda o: -o.saved_bytes)
    table = Table(title=f"largest tensors saved for backward (top {top})")
    for column in ("op", "module", "saved", "flags"):
        table.add_column(column, justify="right" if column == "saved" else "left")
    like = holders[0].saved_bytes if holders else 0
    for op in holders[:top]:
        flags = ", ".join(n for n, on in (("random", op.random), ("in-place", op.inplace)) if on)
        table.add_row(op.op, op.module or "(model)", format_bytes(op.saved_bytes, like), flags)
    console.print(table)


def profile_json(profile: Any, depth: int) -> dict[str, Any]:
    data = asdict(profile)
    data["settings"] = asdict(profile.settings)
    data["by_module"] = module_rows(profile, depth)
    return data


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
