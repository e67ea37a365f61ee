"""``ckptplan fit`` on Hugging Face zoo models, checked by the CPU allocator, and its time at
scale.

For GPT-2, Llama, BERT and ViT (``sample_models/zoo/``, library defaults) at two absolute
budgets each (the least feasible and the unchecked peak at batch 8, as ``solve`` finds them):

1. ``fit`` names the largest batch; the plan at that batch is run for real (``verify``): its
   allocator-measured peak must be within the budget, its gradients the unchecked model's;
2. the next batch is refused by the fake-run-confirmed solve (its least feasible peak shown);
3. the recommended batch (best predicted throughput) is timed beside the other fitting batch
   of the comparison (the largest, or the largest asked below it when the two are the same):
   the pick agrees when the measured throughputs order as predicted, or differ by less than
   the timed pairs' spread.

Then the time ``fit`` takes to answer for the Llama-2-7B and 70B shapes (h100, bf16, 4k
tokens; the 70B with 8-way FSDP), planned on fake tensors.

Writes ``benchmarks/results/fit.json``. One CPU thread; say what else ran when timing.

    python benchmarks/fit.py [--models hf_gpt2,hf_vit] [--skip-scale]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

import ckptplan
from ckptplan.capacity import Fit, FitPoint
from ckptplan.errors import BelowLeastPeak

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / "sample_models" / "zoo"
RESULTS = ROOT / "benchmarks" / "results"
MODELS = ("hf_gpt2", "hf_llama_gqa", "hf_bert", "hf_vit")
BATCH = 8
SHAPES = "benchmarks.models.llama_shapes"


def budgets(model: Path, batch: int) -> tuple[int, int]:
    """The least feasible and the unchecked peak at ``batch``: budgets at which that batch
    fits only checkpointed, and fits unchecked."""
    try:
        ckptplan.solve(model, budget="1", batch_size=batch)
    except BelowLeastPeak as refused:
        least = refused.least_bytes
    unchecked = ckptplan.solve(
        model, budget="100%", solver="none", fake_run=False, batch_size=batch
    )
    return least, unchecked.predicted.peak_bytes


def measured(model: Path, point: FitPoint) -> dict[str, Any]:
    assert point.plan is not None
    check = ckptplan.verify(model, point.plan, repeats=5)
    low, high = check.step_time_ratio_range
    spread = (high - low) / max(check.step_time_ratio, 1e-9)
    return {
        "size": point.size,
        "measured_peak_bytes": check.measured_peak_bytes,
        "predicted_peak_bytes": check.predicted_peak_bytes,
        "within_budget": check.within_budget,
        "max_grad_abs_diff": check.max_grad_abs_diff,
        "step_time_s": check.step_time_s,
        "measured_throughput": point.size / check.step_time_s,
        "predicted_throughput": point.throughput,
        "timing_spread": spread,
    }


def compared_with(result: Fit) -> FitPoint | None:
    """The fitting size the recommended one is timed against."""
    fitting = [p for p in result.points if p.fits]
    if result.recommended != result.largest:
        return next(p for p in fitting if p.size == result.largest)
    below = [p for p in fitting if p.size < result.largest]
    return below[-1] if below else None


def zoo_row(name: str, budget: int) -> dict[str, Any]:
    model = ZOO / f"{name}.py"
    started = time.perf_counter()
    result = ckptplan.fit(model, budget=budget, max_size=256)
    seconds = time.perf_counter() - started
    by_size = {p.size: p for p in result.points}
    largest = measured(model, by_size[result.largest])
    refused = by_size.get(result.largest + 1)
    row: dict[str, Any] = {
        "model": name,
        "budget_bytes": budget,
        "largest": result.largest,
        "recommended": result.recommended,
        "reason": result.reason,
        "fit_seconds": seconds,
        "sizes_asked": [p.size for p in result.points],
        "at_largest": largest,
        "next_refused": refused is not None and not refused.fits,
        "next_least_peak_bytes": None if refused is None else refused.peak_bytes,
    }
    rival = compared_with(result)
    if rival is not None:
        picked = by_size[result.recommended]
        mine = largest if picked.size == result.largest else measured(model, picked)
        theirs = largest if rival.size == result.largest else measured(model, rival)
        gain = mine["measured_throughput"] / theirs["measured_throughput"] - 1
        noise = max(mine["timing_spread"], theirs["timing_spread"])
        row["pick"] = {
            "recommended": mine,
            "against": theirs,
            "measured_gain": gain,
            "noise": noise,
            "agrees": gain >= -noise,
        }
    row["ok"] = largest["within_budget"] and row["next_refused"]
    return row


def scale_row(shape: str, world_size: int) -> dict[str, Any]:
    started = time.perf_counter()
    result = ckptplan.fit(
        f"{SHAPES}:{shape}",
        budget="80GiB",
        max_size=64,
        target="h100",
        dtype="bf16",
        world_size=world_size,
        strategy="fsdp" if world_size > 1 else None,
    )
    return {
        "shape": shape,
        "world_size": world_size,
        "largest": result.largest,
        "recommended": result.recommended,
        "sizes_asked": [p.size for p in result.points],
        "seconds": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--skip-scale", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name in args.models.split(","):
        for budget in budgets(ZOO / f"{name}.py", BATCH):
            row = zoo_row(name, budget)
            print(json.dumps({k: row[k] for k in ("model", "budget_bytes", "largest", "ok")}))
            rows.append(row)
    output = RESULTS / "fit.json"
    if args.skip_scale:  # keep the scale rows an earlier run measured
        scale = json.loads(output.read_text()).get("scale", []) if output.exists() else []
    else:
        scale = [scale_row("llama2_7b_4k", 1), scale_row("llama2_70b_4k", 8)]
    for row in scale:
        print(json.dumps(row))
    RESULTS.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"zoo": rows, "scale": scale}, indent=1))


if __name__ == "__main__":
    main()
