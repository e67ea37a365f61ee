"""The model zoo, planned as a new user would: solve, verify and train every model.

For every model file in ``sample_models/zoo/`` (built from its library's config, library
defaults on) and both budget scopes:

1. the least feasible peak (``solve`` refuses anything below it), against the measured peak of
   the usual recipe: Hugging Face's own checkpointing on every layer where the model has it,
   else torch's checkpoint around every child of every ``ModuleList``/``Sequential`` of
   repeated blocks (the innermost such containers);
2. three budgets between that least peak and the unchecked peak: ``solve`` then ``verify``
   (measured peak against the budget and the prediction, gradient difference);
3. a 3-step AdamW loop with the plan against the same loop without it: losses and parameters;
4. the op-sequence invariant: the fake step's aten ops (with output shapes and dtypes) against
   a real step's.

Peaks are measured by the CPU allocator's own event stream (``verify``'s instrument).

Writes ``benchmarks/results/zoo.json`` and ``benchmarks/results/zoo.md``.

    python benchmarks/zoo.py [--models hf_gpt2,hf_t5] [--scopes step,activations]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

import ckptplan
from ckptplan.callerstate import seed_all
from ckptplan.devices import get_device
from ckptplan.errors import BelowLeastPeak, CkptplanError
from ckptplan.huggingface import training_conventions
from ckptplan.loading import call_model, load_model_file
from ckptplan.profiling.memtrack import keep_freed_host_memory
from ckptplan.profiling.opsequence import first_divergence, step_ops
from ckptplan.profiling.training import cast_model
from ckptplan.values.plan import Plan
from ckptplan.verifying.peers import measure_change

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / "sample_models" / "zoo"
RESULTS = ROOT / "benchmarks" / "results"
FRACTIONS = (0.25, 0.5, 0.75)
"""Where the three budgets sit between the least feasible and the unchecked peak."""
STEPS = 3
MARGIN = get_device("cpu").margin_percent


def recipe(model: torch.nn.Module) -> torch.nn.Module:
    """Checkpoint every repeated block the usual way (see the module docstring)."""
    if getattr(model, "supports_gradient_checkpointing", False):
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        return model
    containers = [
        m
        for m in model.modules()
        if isinstance(m, torch.nn.ModuleList | torch.nn.Sequential) and _repeats(m)
    ]
    innermost = [
        c for c in containers if not any(o is not c and _contains(c, o) for o in containers)
    ]
    for container in innermost:
        for child in container:
            child.forward = _checkpointed(child.forward)
    return model


def _repeats(container: torch.nn.Module) -> bool:
    classes = Counter(type(c) for c in container.children() if list(c.children()))
    return bool(classes) and max(classes.values()) >= 2


def _contains(outer: torch.nn.Module, inner: torch.nn.Module) -> bool:
    return any(m is inner for m in outer.modules())


def _checkpointed(forward: Any) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def train_matches(path: Path, plan: Plan) -> dict[str, float]:
    """Losses and parameters of a 3-step AdamW loop with and without the plan."""
    workload = load_model_file(path)
    results = []
    for planned in (False, True):
        torch.manual_seed(0)
        model = workload.build()
        torch.manual_seed(0)
        inputs, _ = training_conventions(model, workload.inputs(plan.settings.batch_size))
        model = cast_model(model, torch.float32).train()
        if planned:
            ckptplan.apply(model, plan)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
        losses = []
        for step in range(STEPS):
            seed_all(100 + step)  # torch, Python and NumPy: wav2vec 2.0 masks with NumPy
            loss = workload.loss(call_model(model, inputs))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
        results.append((losses, [p.detach().clone() for p in model.parameters()]))
    (loss_a, params_a), (loss_b, params_b) = results
    return {
        "max_loss_diff": max(abs(a - b) for a, b in zip(loss_a, loss_b, strict=True)),
        "max_param_diff": max(
            (a - b).abs().max().item() for a, b in zip(params_a, params_b, strict=True)
        ),
    }


def op_sequence(path: Path, notes: tuple[str, ...]) -> str:
    """ "same" when the fake step runs the real step's ops, else where they part."""
    if any("real step" in note for note in notes):
        return "same (profiled with a real step)"
    workload = load_model_file(path)
    divergence = first_divergence(step_ops(workload, real=False), step_ops(workload, real=True))
    return divergence or "same"


def least_peak(path: Path, scope: str) -> int:
    try:
        ckptplan.solve(path, budget="1", scope=scope)
    except BelowLeastPeak as exc:
        return exc.least_bytes
    raise AssertionError("a 1-byte budget was accepted")


def run_model(path: Path, scope: str) -> dict[str, Any]:
    started = time.perf_counter()
    row: dict[str, Any] = {"model": path.stem, "scope": scope}
    profile = ckptplan.profile(path)
    row["units"] = len(profile.blocks)
    row["notes"] = list(profile.notes)
    row["op_sequence"] = op_sequence(path, profile.notes)
    least = least_peak(path, scope)
    unchecked = ckptplan.solve(path, budget="100%", solver="none", scope=scope, fake_run=False)
    # The least peak is a fake run's; where no checkpoint lowers the step's peak (a step that
    # peaks in the optimizer) it may lie a few bytes over the chain model's unchecked peak.
    top = max(unchecked.predicted.peak_bytes, least)
    settings = replace(unchecked.settings, batch_size=None)
    reference = measure_change(load_model_file(path), settings, recipe, repeats=1)
    row.update(
        least_bytes=least,
        unchecked_bytes=top,
        recipe_measured_bytes=reference.measured_peak_bytes,
        least_within_recipe=least <= reference.measured_peak_bytes,
        recipe_time_ratio=reference.step_time_ratio,
    )
    points = []
    for fraction in FRACTIONS:
        # Above the least peak by the share the solver holds back (its margin), and a byte for
        # the solver's rounding of that share (its aim is the budget less the rounded margin).
        budget = math.ceil((least + fraction * (top - least)) / (1 - MARGIN / 100)) + 1
        plan = ckptplan.solve(path, budget=str(budget), scope=scope)
        check = ckptplan.verify(path, plan, repeats=3)
        error = abs(check.measured_peak_bytes - check.predicted_peak_bytes)
        point = {
            "fraction": fraction,
            "budget_bytes": budget,
            "predicted_bytes": check.predicted_peak_bytes,
            "fake_run_bytes": plan.predicted.fake_run_peak_bytes,
            "measured_bytes": check.measured_peak_bytes,
            "within_budget": check.measured_peak_bytes <= budget,
            "prediction_error": error / check.measured_peak_bytes,
            "max_grad_diff": check.max_grad_abs_diff,
            "time_ratio": check.step_time_ratio,
            "regions": len(plan.regions),
        }
        if fraction == FRACTIONS[1]:
            point.update(train_matches(path, plan))
        points.append(point)
    row["points"] = points
    row["seconds"] = time.perf_counter() - started
    return row


def summary(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | scope | units | fake ops = real | least | recipe measured | least ≤ recipe | "
        "budgets ≤ | max pred. error | max grad diff | 3-step loop diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    mib = 2**20
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['scope']} | error: {r['error']} |")
            continue
        points = r["points"]
        loop = max(p.get("max_param_diff", 0.0) for p in points)
        lines.append(
            f"| {r['model']} | {r['scope']} | {r['units']} | "
            f"{'yes' if r.get('op_sequence', '').startswith('same') else 'NO'} | "
            f"{r['least_bytes'] / mib:.2f} MiB | "
            f"{r['recipe_measured_bytes'] / mib:.2f} MiB | "
            f"{'yes' if r['least_within_recipe'] else 'NO'} | "
            f"{sum(p['within_budget'] for p in points)}/{len(points)} | "
            f"{max(p['prediction_error'] for p in points):.1%} | "
            f"{max(p['max_grad_diff'] for p in points):.1e} | {loop:.1e} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    keep_freed_host_memory()  # steady CPU step times; the library leaves malloc alone
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated zoo file stems (default: all)")
    parser.add_argument("--scopes", default="step,activations")
    parser.add_argument("--output", default=str(RESULTS / "zoo.json"))
    args = parser.parse_args()
    files = sorted(ZOO.glob("*.py"))
    if args.models:
        wanted = set(args.models.split(","))
        files = [f for f in files if f.stem in wanted]
    torch.set_num_threads(1)
    rows = []
    for path in files:
        for scope in args.scopes.split(","):
            try:
                row = run_model(path, scope)
            except (CkptplanError, Exception) as exc:
                traceback.print_exc()
                row = {"model": path.stem, "scope": scope, "error": f"{type(exc).__name__}: {exc}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    ran = {(r["model"], r["scope"]) for r in rows}
    if output.exists():  # a run of some models updates their rows and keeps the others
        earlier = json.loads(output.read_text())["rows"]
        rows = sorted(
            [r for r in earlier if (r["model"], r["scope"]) not in ran] + rows,
            key=lambda r: (r["model"], r["scope"] != "step"),
        )
    output.write_text(json.dumps({"threads": 1, "rows": rows}, indent=2) + "\n")
    output.with_suffix(".md").write_text(summary(rows))
    print(summary(rows))
    sys.exit(0 if all("error" not in r for r in rows if (r["model"], r["scope"]) in ran) else 1)


if __name__ == "__main__":
    main()
