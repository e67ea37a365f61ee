"""Rich rendering of a profile (``ckptplan profile``): what a step costs by module, the chain
of blocks, and the largest tensors saved for backward; and the same as JSON.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from ckptplan.profiling.describe import describe_units
from ckptplan.values.phase import Phase
from ckptplan.wording import ByteUnit, batch_words


def _at_depth(path: str, depth: int) -> str:
    return ".".join(path.split(".")[:depth]) if path else ""


def module_rows(profile: Any, depth: int) -> list[dict[str, Any]]:
    """Per-module totals at ``depth`` (module paths cut to that many parts), in run order."""
    classes = {path: (cls, params) for path, cls, params in profile.modules}
    rows: dict[str, dict[str, Any]] = {}
    for op in profile.ops:
        optimizer = op.phase == Phase.optimizer().label
        key = "(optimizer step)" if optimizer else _at_depth(op.module, depth)
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
    """What a step costs, by module, with the largest holders of memory for backward; every
    memory figure in the unit of the step's peak."""
    s = profile.settings
    size = ByteUnit.of(profile.peak_bytes)
    precision = s.dtype + (f" autocast {s.autocast}" if s.autocast else "")
    console.print(
        f"[bold]ckptplan profile[/] · {profile.model_name} ({profile.fingerprint['class']}, "
        f"{profile.fingerprint['parameters']:,} parameters) · "
        f"{batch_words(s.batch_size, profile.inputs)} · {precision} · optimizer "
        f"{s.optimizer} · times {'measured here' if s.measure else 'estimated for ' + s.device}"
    )
    peak = profile.peak_bytes
    console.print(
        f"unchecked peak [bold]{size(peak)}[/] · persistent {size(profile.persistent_bytes)} "
        f"(parameters {size(profile.parameter_bytes)}, optimizer "
        f"{size(profile.optimizer_bytes)}, batch {size(profile.input_bytes)}) · "
        f"{_flops(profile.flops)}FLOP · step "
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
    for row in rows:
        table.add_row(
            row["module"],
            row["class"],
            f"{row['parameters']:,}",
            size(row["saved_bytes"]),
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
            size(b.saved_bytes),
            "yes" if b.input_kept else "no",
            size(b.fwd_peak),
            size(b.bwd_peak),
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
    for op in holders[:top]:
        flags = ", ".join(n for n, on in (("random", op.random), ("in-place", op.inplace)) if on)
        table.add_row(op.op, op.module or "(model)", size(op.saved_bytes), flags)
    console.print(table)


def profile_json(profile: Any, depth: int) -> dict[str, Any]:
    data = asdict(profile)
    data["settings"] = asdict(profile.settings)
    data["by_module"] = module_rows(profile, depth)
    return data
