"""How well ckptplan predicts: peak memory and step-time overhead, predicted vs measured (CPU).

For every sample model and the plans none, full, sqrt and dp at three budgets: the chain
model's predicted peak, the fake-run peak (the checkpointed step executed on fake tensors) and
the measured peak of a real step on this machine; and the predicted recompute overhead, both
with op times measured (``--measure``) and from the default CPU roofline (``roofline_overhead``,
what ``solve`` predicts without ``--measure``), against the measured step-time ratio minus one
(the median of back-to-back pairs; ``measured_overhead_range`` is the least and greatest pair,
the noise). A prediction agrees when it is within 25% (relative) of the measured overhead.

    python benchmarks/accuracy.py [--models gpt mlp] [--repeats 5] [--threads 1]

On a CPU shared with other jobs, ``--threads 1`` keeps a busy core from stalling every
parallel op of the step (with 2 threads a step took 0.6 s or 4.4 s minutes apart).

Writes benchmarks/results/accuracy.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

import ckptplan
from ckptplan.loading import load_model_file
from ckptplan.planning.problem import to_chain
from ckptplan.planning.schedule_plan import plan_from_schedule
from ckptplan.profiling.memtrack import keep_freed_host_memory
from ckptplan.solvers import run_solver
from ckptplan.solvers.chain import simulate
from ckptplan.stepping.fakerun import fake_run_peak
from ckptplan.values.budget import ResolvedBudget, format_bytes

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "accuracy.json"
MODELS = ("mlp", "gpt", "resnet", "unet", "vit")


def agrees(predicted: float, measured: float) -> bool:
    """Within 25% relative of the measured overhead (the test ``verify`` reports)."""
    return abs(predicted - measured) <= 0.25 * abs(measured)


def cases(model: Path, repeats: int) -> list[dict]:
    profile = ckptplan.profile(model, measure=True)
    chain = to_chain(profile)
    roofline = ckptplan.profile(model)
    roofline_chain = to_chain(roofline)
    none, full = run_solver("none", chain, None), run_solver("full", chain, None)
    schedules = [none, full, run_solver("sqrt", chain, None)]
    for fraction in (0.25, 0.5, 0.75):
        budget = int(full.peak + fraction * (none.peak - full.peak))
        schedules.append(run_solver("dp", chain, budget))
    rows = []
    workload = load_model_file(model)
    for schedule in schedules:
        plan = plan_from_schedule(profile, chain, schedule, ResolvedBudget("benchmark", none.peak))
        fake = fake_run_peak(workload, plan)
        result = ckptplan.verify(model, plan, repeats=repeats)
        measured = result.measured_peak_bytes
        low, high = result.step_time_ratio_range
        roofline_time = simulate(roofline_chain, schedule.segments).recompute_time
        rows.append(
            {
                "model": model.name,
                "plan": schedule.solver,
                "regions": len(plan.regions),
                "predicted_peak_bytes": schedule.peak,
                "fake_run_peak_bytes": fake,
                "measured_peak_bytes": measured,
                "peak_error": (schedule.peak - measured) / measured,
                "fake_run_error": (fake - measured) / measured,
                "predicted_overhead": plan.predicted.overhead,
                "roofline_overhead": roofline_time / roofline.step_time,
                "measured_overhead": result.step_time_ratio - 1,
                "measured_overhead_range": [low - 1, high - 1],
                "max_grad_abs_diff": result.max_grad_abs_diff,
            }
        )
    return rows


def main() -> None:
    keep_freed_host_memory()  # steady CPU step times; the library leaves malloc alone
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rows = [
        row
        for name in args.models
        for row in cases(ROOT / "sample_models" / f"{name}.py", args.repeats)
    ]
    table = Table(title="predicted vs measured on this CPU")
    for column in (
        "model",
        "plan",
        "predicted",
        "fake run",
        "measured",
        "peak err",
        "fake err",
        "overhead pred",
        "roofline",
        "overhead meas",
        "meas range",
        "grad diff",
    ):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            r["model"],
            r["plan"],
            format_bytes(r["predicted_peak_bytes"]),
            format_bytes(r["fake_run_peak_bytes"]),
            format_bytes(r["measured_peak_bytes"]),
            f"{100 * r['peak_error']:+.1f}%",
            f"{100 * r['fake_run_error']:+.2f}%",
            f"{100 * r['predicted_overhead']:.1f}%",
            f"{100 * r['roofline_overhead']:.1f}%",
            f"{100 * r['measured_overhead']:.1f}%",
            "{:.0f}..{:.0f}%".format(*(100 * x for x in r["measured_overhead_range"])),
            f"{r['max_grad_abs_diff']:.0e}",
        )
    console = Console(width=160)
    console.print(table)
    worst_peak = max(abs(r["peak_error"]) for r in rows)
    worst_fake = max(abs(r["fake_run_error"]) for r in rows)
    checked = [r for r in rows if r["plan"] != "none"]
    agree = {
        key: sum(agrees(r[key], r["measured_overhead"]) for r in checked)
        for key in ("predicted_overhead", "roofline_overhead")
    }
    console.print(
        f"worst peak error {100 * worst_peak:.2f}%, worst fake-run error {100 * worst_fake:.2f}%"
        f" ({torch.get_num_threads()} CPU threads); overhead within 25% of measured in"
        f" {agree['predicted_overhead']} of {len(checked)} plans measured op by op,"
        f" {agree['roofline_overhead']} of {len(checked)} from the roofline"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "cases": rows,
                "worst_peak_error": worst_peak,
                "worst_fake_run_error": worst_fake,
                "overhead_agrees": {key: [n, len(checked)] for key, n in agree.items()},
                "threads": torch.get_num_threads(),
            },
            indent=2,
        )
    )
    console.print(f"results written to {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
