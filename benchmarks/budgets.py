"""Solve and verify sample models at budgets spread between full checkpointing and none.

For each budget: the plan's predicted and measured (local device) peak, the prediction error,
the measured step-time ratio against the unchecked step and the max gradient difference; and,
per model, dp's predicted recompute time against sqrt and every-k at their own peaks.

    python benchmarks/budgets.py                      # gpt.py, default batch, five budgets
    python benchmarks/budgets.py --models gpt mlp vit --points 5

Writes benchmarks/results/budgets.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import ckptplan
from ckptplan.planning.problem import to_chain
from ckptplan.profiling.memtrack import keep_freed_host_memory
from ckptplan.solvers import run_solver
from ckptplan.values.budget import format_bytes

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "budgets.json"


def budget_sweep(model: Path, points: int, repeats: int) -> list[dict]:
    full = ckptplan.solve(model, budget="1.0", solver="full")
    low, high = full.predicted.peak_bytes, full.baselines["none"]["peak_bytes"]
    rows = []
    for i in range(points):
        budget = int(low + (high - low) * i / max(1, points - 1))
        started = time.perf_counter()
        plan = ckptplan.solve(model, budget=str(budget))
        solve_s = time.perf_counter() - started
        result = ckptplan.verify(model, plan, repeats=repeats)
        rows.append(
            {
                "model": model.name,
                "budget_bytes": budget,
                "regions": [list(r.modules) for r in plan.regions],
                "predicted_peak_bytes": result.predicted_peak_bytes,
                "measured_peak_bytes": result.measured_peak_bytes,
                "baseline_peak_bytes": result.baseline_peak_bytes,
                "prediction_error": result.prediction_error,
                "within_budget": result.within_budget,
                "predicted_overhead": plan.predicted.overhead,
                "step_time_ratio": result.step_time_ratio,
                "max_grad_abs_diff": result.max_grad_abs_diff,
                "solve_seconds": solve_s,
            }
        )
    return rows


def against_fixed_policies(model: Path) -> list[dict]:
    chain = to_chain(ckptplan.profile(model))
    rows = []
    for fixed in ("sqrt", "every-k", "full"):
        baseline = run_solver(fixed, chain, None)
        plan = run_solver("dp", chain, baseline.peak)
        rows.append(
            {
                "model": model.name,
                "policy": baseline.solver,
                "peak_bytes": baseline.peak,
                "policy_recompute_s": baseline.recompute_time,
                "dp_recompute_s": plan.recompute_time,
                "dp_peak_bytes": plan.peak,
            }
        )
    return rows


def main() -> None:
    keep_freed_host_memory()  # steady CPU step times; the library leaves malloc alone
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt"])
    parser.add_argument("--points", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--policies", nargs="+", default=["mlp", "gpt", "resnet", "unet", "vit"])
    args = parser.parse_args()
    sweep = [
        row
        for name in args.models
        for row in budget_sweep(ROOT / "sample_models" / f"{name}.py", args.points, args.repeats)
    ]
    policies = [
        row
        for name in args.policies
        for row in against_fixed_policies(ROOT / "sample_models" / f"{name}.py")
    ]
    console = Console(width=140)
    table = Table(title="solve + verify at budgets between full checkpointing and none")
    for column in (
        "model",
        "budget",
        "predicted",
        "measured",
        "error",
        "fits",
        "time ratio",
        "max grad diff",
    ):
        table.add_column(column, justify="right")
    for r in sweep:
        table.add_row(
            r["model"],
            format_bytes(r["budget_bytes"]),
            format_bytes(r["predicted_peak_bytes"]),
            format_bytes(r["measured_peak_bytes"]),
            f"{100 * r['prediction_error']:.1f}%",
            "yes" if r["within_budget"] else "NO",
            f"{r['step_time_ratio']:.2f}",
            f"{r['max_grad_abs_diff']:.1e}",
        )
    console.print(table)
    table = Table(title="dp against fixed policies at the policy's own peak (predicted)")
    for column in ("model", "policy", "peak", "policy recompute", "dp recompute"):
        table.add_column(column, justify="right")
    for r in policies:
        table.add_row(
            r["model"],
            r["policy"],
            format_bytes(r["peak_bytes"]),
            f"{r['policy_recompute_s']:.4f} s",
            f"{r['dp_recompute_s']:.4f} s",
        )
    console.print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"budget_sweep": sweep, "fixed_policies": policies}, indent=2))
    console.print(f"results written to {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
