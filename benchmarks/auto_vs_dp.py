"""Is ``auto`` ever slower than ``dp`` at the same budget? Timed as a paired A/B in one process.

For each sample model and budgets between the full-checkpoint peak and the unchecked peak,
``solve`` makes the auto and the dp plan. Where they are the same plan, auto ties dp by
construction. Where they differ, both run interleaved (ABBA...) in one process, and each
round's auto/dp step-time ratio is kept. The median ratio is auto's cost against dp; the range
of the rounds is the noise this measurement has. The pareto benchmark instead measures each plan
against the unchecked step separately, and so adds the noise of two comparisons.

    python benchmarks/auto_vs_dp.py [--models gpt vit sample_models/zoo/hf_bert.py] [--repeats 9]

Writes benchmarks/results/auto_vs_dp.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

import ckptplan
from ckptplan.loading import load_model_file
from ckptplan.profiling.memtrack import keep_freed_host_memory
from ckptplan.verifying.pairtiming import interleaved_step_times

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "auto_vs_dp.json"
"""Rows are merged by model, so a run of some models keeps the others'."""
MODELS = ("mlp", "gpt", "resnet", "unet", "vit")
POSITIONS = (0.25, 0.5, 0.75)
"""Budgets as positions between the full-checkpoint peak (0) and the unchecked peak (1)."""


def cases(model: Path, repeats: int) -> list[dict]:
    full = ckptplan.solve(model, budget="1.0", solver="full")
    low, high = full.predicted.peak_bytes, full.baselines["none"]["peak_bytes"]
    rows = []
    for position in POSITIONS:
        budget = int(low + position * (high - low))
        auto = ckptplan.solve(model, budget=budget, solver="auto")
        segments = ckptplan.solve(model, budget=budget, solver="dp")
        row = {
            "model": model.stem,
            "budget_bytes": budget,
            "auto_regions": [r.to_json() for r in auto.regions],
            "dp_regions": [r.to_json() for r in segments.regions],
            "auto_predicted_overhead": auto.predicted.overhead,
            "dp_predicted_overhead": segments.predicted.overhead,
        }
        if row["auto_regions"] == row["dp_regions"]:
            rows.append({**row, "same_plan": True})
            continue
        times = interleaved_step_times(
            load_model_file(model), {"auto": auto, "dp": segments}, repeats
        )
        ratios = [a / d for a, d in zip(times["auto"], times["dp"], strict=True)]
        rows.append(
            {
                **row,
                "same_plan": False,
                "auto_over_dp": statistics.median(ratios),
                "auto_over_dp_range": [min(ratios), max(ratios)],
            }
        )
    return rows


def model_path(name: str) -> Path:
    """A sample's name (``gpt``) or a model file's path (``sample_models/zoo/hf_llama_gqa.py``)."""
    return Path(name) if name.endswith(".py") else ROOT / "sample_models" / f"{name}.py"


def main() -> None:
    keep_freed_host_memory()  # steady CPU step times; the library leaves malloc alone
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [row for name in args.models for row in cases(model_path(name), args.repeats)]
    timed = [r for r in rows if not r["same_plan"]]
    worst = max((r["auto_over_dp"] for r in timed), default=1.0)
    for r in rows:
        verdict = (
            "same plan"
            if r["same_plan"]
            else "auto/dp {:.3f} (rounds {:.3f}..{:.3f})".format(
                r["auto_over_dp"], *r["auto_over_dp_range"]
            )
        )
        print(f"{r['model']:7s} budget {r['budget_bytes'] / 2**20:8.1f} MiB: {verdict}")
    print(
        f"{len(rows) - len(timed)} of {len(rows)} budgets give dp's plan; worst auto/dp {worst:.3f}"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "rows": rows,
                "worst_auto_over_dp": worst,
                "repeats": args.repeats,
                "threads": args.threads,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
