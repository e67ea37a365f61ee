"""Predictions against a CUDA GPU: plans made for the GPU on fake tensors, measured on it.

Two models in bf16, each at three budgets between the least feasible and the unchecked peak
(and one ``fit`` point: the largest batch of the GPT sample within its unchecked peak at the
check's batch, that batch's plan measured on the device):
the GPT sample and Hugging Face's Llama (GQA, its ``sdpa`` attention, which runs flash
attention on the GPU). For each plan: ``torch.cuda.max_memory_allocated`` and
``max_memory_reserved`` against the prediction, measured step-time overhead against the
predicted one, and the largest gradient difference. Beside them, on the same model and batch,
the peers: Hugging Face's checkpointing of every layer (the Llama) and ``torch.compile``'s
``activation_memory_budget`` at the same fraction as each budget.

    python benchmarks/gpu_check.py            # on a CUDA GPU, within 8 minutes
    python benchmarks/gpu_check.py --self-test  # on the CPU, small, as the tests run it

Writes ``benchmarks/results/gpu_check.json`` (the self-test writes where ``--output`` says).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

import ckptplan
from ckptplan.errors import BelowLeastPeak
from ckptplan.loading import load_model_file
from ckptplan.profiling.memtrack import keep_freed_host_memory
from ckptplan.verifying.peers import measure_change, measure_compile_budget

ROOT = Path(__file__).resolve().parent.parent
MODELS = {
    "gpt": ROOT / "sample_models" / "gpt.py",
    "hf_llama": ROOT / "sample_models" / "zoo" / "hf_llama_gqa.py",
}
FRACTIONS = (0.2, 0.5, 0.8)
"""Where the budgets sit between the least feasible and the unchecked peak."""
GPU_NAMES = {"H200": "h200", "H100": "h100", "B200": "b200", "A100": "a100", "L4": "l4"}


def device_kind() -> str:
    """ckptplan's name for the GPU at hand (``rtx4090`` for a GeForce, else ``h100``)."""
    name = torch.cuda.get_device_name(0)
    if "4090" in name:
        return "rtx4090"
    return next((kind for key, kind in GPU_NAMES.items() if key in name), "h100")


def hf_every_layer(model: torch.nn.Module) -> torch.nn.Module:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


@dataclass(frozen=True)
class Setup:
    """Where and how hard to check: the GPU, or the CPU self-test (small, one budget)."""

    kind: str
    target: str
    batch_size: int
    fractions: tuple[float, ...]
    repeats: int
    compile_peer: bool
    solver: str = "auto"


def least_peak(path: Path, common: dict[str, Any]) -> int:
    try:
        ckptplan.solve(path, budget="1", margin=0, **common)
    except BelowLeastPeak as refused:
        return refused.least_bytes
    raise AssertionError("a 1-byte budget was accepted")


def check_model(name: str, setup: Setup) -> dict[str, Any]:
    """Solve, verify and measure the peers for one model at every fraction."""
    path = MODELS[name]
    common = {"dtype": "bf16", "target": setup.kind, "batch_size": setup.batch_size}
    unchecked = ckptplan.solve(path, budget="100%", solver="none", fake_run=False, **common)
    top = unchecked.predicted.peak_bytes
    least = least_peak(path, {**common, "solver": setup.solver})
    row: dict[str, Any] = {"model": name, "least_bytes": least, "unchecked_bytes": top}
    settings = replace(unchecked.settings, scope="step")
    workload = load_model_file(path)
    target, repeats = setup.target, setup.repeats
    if name.startswith("hf_"):
        hf = measure_change(workload, settings, hf_every_layer, device=target, repeats=repeats)
        row["hf_every_layer"] = _peer(hf)
    points = []
    for fraction in setup.fractions:
        budget = int(least + fraction * (top - least))
        plan = ckptplan.solve(path, budget=str(budget), solver=setup.solver, **common)
        check = ckptplan.verify(path, plan, run_on=target, repeats=repeats)
        point = {
            "fraction": fraction,
            "budget_bytes": budget,
            "predicted_bytes": check.predicted_peak_bytes,
            "allocated_bytes": check.measured_peak_bytes,
            "reserved_bytes": check.reserved_peak_bytes,
            "within_budget": check.within_budget,
            "prediction_error": check.prediction_error,
            "predicted_overhead": check.predicted_overhead,
            "measured_overhead": check.step_time_ratio - 1,
            "overhead_agrees": check.overhead_agrees,
            "max_grad_diff": check.max_grad_abs_diff,
            "grads_match": check.grads_match,
            "regions": len(plan.regions),
        }
        if setup.compile_peer:
            share = budget / top
            compiled = measure_compile_budget(workload, settings, share, target, repeats)
            point["torch_compile_budget"] = {"memory_budget": share, **_peer(compiled)}
        points.append(point)
    row["points"] = points
    return row


def fit_point(setup: Setup) -> dict[str, Any]:
    """``fit`` for the GPU at the GPT sample's unchecked peak at the check's batch: the
    largest batch its plans fit, that batch's plan measured on the device, the next refused."""
    path = MODELS["gpt"]
    step = {"target": setup.kind, "dtype": "bf16"}
    unchecked = ckptplan.solve(
        path, budget="100%", solver="none", fake_run=False, batch_size=setup.batch_size, **step
    )
    budget = unchecked.predicted.peak_bytes
    started = time.perf_counter()
    answer = ckptplan.fit(path, budget=budget, max_size=4 * setup.batch_size, **step)
    seconds = time.perf_counter() - started
    sizes = {p.size: p for p in answer.points}
    plan = answer.plan_for(answer.largest)
    check = ckptplan.verify(path, plan, run_on=setup.target, repeats=setup.repeats)
    return {
        "budget_bytes": budget,
        "largest": answer.largest,
        "recommended": answer.recommended,
        "fit_seconds": seconds,
        "allocated_bytes": check.measured_peak_bytes,
        "within_budget": check.within_budget,
        "next_refused": answer.largest + 1 in sizes and not sizes[answer.largest + 1].fits,
        "grads_match": check.grads_match,
    }


def _peer(result: Any) -> dict[str, Any]:
    return {
        "allocated_bytes": result.measured_peak_bytes,
        "reserved_bytes": result.reserved_peak_bytes,
        "overhead": result.step_time_ratio - 1,
        "max_grad_diff": result.max_grad_abs_diff,
    }


def run(self_test: bool) -> dict[str, Any]:
    """Every model; on the CPU (``self_test``) small, at one budget, segments only, without
    the compile peer."""
    if self_test:
        setup = Setup("cpu", "cpu", 1, (0.5,), 1, compile_peer=False, solver="dp")
    elif not torch.cuda.is_available():
        raise SystemExit("gpu_check needs a CUDA GPU; --self-test runs it on the CPU")
    else:
        setup = Setup(device_kind(), "cuda", 16, FRACTIONS, 3, compile_peer=True)
    started = time.perf_counter()
    rows = [check_model(name, setup) for name in MODELS]
    fitted = fit_point(setup)
    return {
        "device": "cpu" if self_test else torch.cuda.get_device_name(0),
        "device_kind": setup.kind,
        "torch": torch.__version__,
        "self_test": self_test,
        "seconds": time.perf_counter() - started,
        "models": rows,
        "fit": fitted,
        "all_within_budget": all(p["within_budget"] for r in rows for p in r["points"]),
        "all_grads_match": all(p["grads_match"] for r in rows for p in r["points"]),
        "max_prediction_error": max(p["prediction_error"] for r in rows for p in r["points"]),
    }


def main() -> None:
    keep_freed_host_memory()  # steady CPU step times; the library leaves malloc alone
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--self-test", action="store_true", help="run small, on the CPU")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "gpu_check.json"))
    args = parser.parse_args()
    result = run(args.self_test)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "models"}, indent=2))


if __name__ == "__main__":
    main()
