"""How well a ``--compile`` plan's fake-run peak predicts inductor's real step (CPU allocator).

For every sample model, the plans ``solve(..., compiled=True)`` makes at a few budgets (a
percentage of the compiled unchecked step): the fake-run peak the plan records (inductor's own
memory lines, replayed: ``ckptplan.stepping.inductor_memory``) beside the CPU allocator's peak of
the same plan compiled by real inductor and run (``verify``), and whether that peak is within the
budget. A prediction under the measured peak is the one that breaks a budget.

    python benchmarks/compiled_accuracy.py [--models vit mlp] [--budgets 90% 60%]

Writes benchmarks/results/compiled_accuracy.json (rows merged by model) and prints a table.
Memory only: no timing figure is reported, so other jobs on the machine do not change it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

import ckptplan
from ckptplan.values.budget import format_bytes

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "compiled_accuracy.json"
MODELS = ("mlp", "vit", "gpt", "resnet", "unet")
BUDGETS = ("90%", "70%", "50%")


def cases(model: Path, budgets: list[str]) -> list[dict]:
    rows = []
    for budget in budgets:
        try:
            plan = ckptplan.solve(model, budget=budget, compiled=True)
        except ckptplan.CkptplanError as exc:
            rows.append({"model": model.stem, "budget": budget, "refused": str(exc)})
            continue
        except Exception as exc:  # a failure inside ckptplan: recorded, not hidden
            rows.append({"model": model.stem, "budget": budget, "failed": f"solve: {exc}"[:300]})
            continue
        try:
            result = ckptplan.verify(model, plan, run_on="cpu", repeats=1)
        except Exception as exc:  # inductor failing to compile the plan, say
            rows.append({"model": model.stem, "budget": budget, "failed": f"verify: {exc}"[:300]})
            continue
        predicted, measured = plan.predicted.fake_run_peak_bytes, result.measured_peak_bytes
        rows.append(
            {
                "model": model.stem,
                "budget": budget,
                "budget_bytes": plan.budget.bytes,
                "regions": len(plan.regions),
                "policied_regions": sum(r.policy is not None for r in plan.regions),
                "fake_run_peak_bytes": predicted,
                "measured_peak_bytes": measured,
                "fake_run_error": (predicted - measured) / measured,
                "within_budget": result.within_budget,
                "max_grad_abs_diff": result.max_grad_abs_diff,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--budgets", nargs="+", default=list(BUDGETS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [
        row
        for name in args.models
        for row in cases(ROOT / "sample_models" / f"{name}.py", args.budgets)
    ]
    # Rows merge by model: each model may be measured in a process of its own.
    kept = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    rows = [r for r in kept if r["model"] not in args.models] + rows
    RESULTS.write_text(json.dumps(rows, indent=1) + "\n")
    table = Table(title="compiled plans: fake-run peak vs the allocator under inductor")
    for column in ("model", "budget", "regions", "fake run", "measured", "error", "in budget"):
        table.add_column(column, justify="right")
    for r in rows:
        if "refused" in r or "failed" in r:
            note = r.get("refused") or r["failed"]
            table.add_row(r["model"], r["budget"], note[:60], "", "", "", "")
            continue
        table.add_row(
            r["model"],
            r["budget"],
            f"{r['regions']} ({r['policied_regions']} selective)",
            format_bytes(r["fake_run_peak_bytes"]),
            format_bytes(r["measured_peak_bytes"]),
            f"{100 * r['fake_run_error']:+.3f}%",
            "yes" if r["within_budget"] else "NO",
        )
    Console(width=140).print(table)
    measured = [r for r in rows if "measured_peak_bytes" in r]
    worst = min((r["fake_run_error"] for r in measured), default=0.0)
    print(f"most under the allocator: {100 * worst:+.3f}% ({len(measured)} plans)")


if __name__ == "__main__":
    main()
