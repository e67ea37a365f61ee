"""Measured memory/step-time frontier of every strategy on every sample model (CPU).

For each sample model: none, full, sqrt, every-2, every-3, the dp and auto frontiers
(``--points`` budgets each), auto at each fixed policy's peak, and torch.compile's memory
budget, every plan run for real: measured peak and step-time ratio. Checks that no fixed
policy is both faster and smaller than auto (dominance), and measures auto against full at
the full-checkpoint peak + 2% (the tightest budget where choosing matters).

    python benchmarks/pareto.py [--models gpt mlp] [--points 6] [--repeats 5] [--threads 1]

``--threads 1`` steadies step times on a CPU that other jobs share.

Writes benchmarks/results/pareto.json and benchmarks/results/pareto_<model>.png.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from rich.console import Console

import ckptplan
from ckptplan.cli.report import show_sweep
from ckptplan.loading import load_model_file
from ckptplan.profiling.memtrack import keep_freed_host_memory
from ckptplan.profiling.profiler import Settings
from ckptplan.verifying.sweep import SweepOptions, SweepPoint, sweep
from ckptplan.verifying.sweep_plot import save_plot

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MODELS = ("mlp", "gpt", "resnet", "unet", "vit")
FIXED = ("full", "sqrt", "every-2", "every-3")


def dominated_by_fixed(points: list[SweepPoint], tolerance: float = 0.02) -> list[str]:
    """Fixed policies that beat every auto point of no larger peak on measured time.

    ``tolerance`` absorbs timing noise: a fixed point counts as faster only by more than it.
    """
    auto = [p for p in points if p.strategy == "auto"]
    losses = []
    for fixed in (p for p in points if p.strategy in FIXED):
        assert fixed.measured_peak_bytes is not None and fixed.measured_overhead is not None
        rivals = [a for a in auto if (a.measured_peak_bytes or 0) <= fixed.measured_peak_bytes]
        if not rivals or all(
            fixed.measured_overhead < (a.measured_overhead or 0) - tolerance for a in rivals
        ):
            losses.append(fixed.strategy)
    return losses


def auto_against_full(model: Path, repeats: int) -> dict[str, float]:
    """Measured overhead of auto and of full at a budget of full's predicted peak + 2%."""
    full = ckptplan.solve(model, budget="1.0", solver="full", measure=True)
    budget = int(1.02 * full.predicted.peak_bytes)
    auto = ckptplan.solve(model, budget=budget, solver="auto", measure=True)
    measured = {
        name: ckptplan.verify(model, plan, repeats=repeats).step_time_ratio - 1
        for name, plan in (("full", full), ("auto", auto))
    }
    return {
        "budget_bytes": budget,
        "full_overhead": measured["full"],
        "auto_overhead": measured["auto"],
        "ratio": measured["auto"] / measured["full"] if measured["full"] > 0 else float("nan"),
        "full_predicted": full.predicted.overhead,
        "auto_predicted": auto.predicted.overhead,
    }


def main() -> None:
    keep_freed_host_memory()  # steady CPU step times; the library leaves malloc alone
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--points", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    console = Console(width=140)
    out = RESULTS / "pareto.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    # Models measured in earlier runs stay; each model is written as soon as it is done.
    results: dict[str, dict] = {}
    for name in args.models:
        path = ROOT / "sample_models" / f"{name}.py"
        workload = load_model_file(path)
        options = SweepOptions(points=args.points, verify=True, repeats=args.repeats, run_on="cpu")
        result = sweep(workload, Settings(measure=True), options)
        points = result.points
        console.rule(name)
        show_sweep(result, console)
        losses = dominated_by_fixed(points)
        console.print(f"fixed policies faster and smaller than auto: {losses or 'none'}")
        tight = auto_against_full(path, 2 * args.repeats)
        console.print(
            f"at the full-checkpoint peak + 2%: auto {tight['auto_overhead']:+.1%} against full "
            f"{tight['full_overhead']:+.1%} measured (ratio {tight['ratio']:.2f}); predicted "
            f"{tight['auto_predicted']:+.1%} against {tight['full_predicted']:+.1%}"
        )
        results[name] = {
            "points": [p.to_json() for p in points],
            "auto_beaten_by": losses,
            "full_peak_plus_2pct": tight,
            "settings": {"points": args.points, "repeats": args.repeats, "threads": args.threads},
        }
        save_plot(result, str(RESULTS / f"pareto_{name}.png"))
        # Re-read before writing: several runs (one model each) may share the file.
        merged = json.loads(out.read_text()) if out.exists() else {}
        merged[name] = results[name]
        out.write_text(json.dumps(merged, indent=2))
    console.print(f"results written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
