"""Fit the CPU roofline (``ckptplan.devices``' ``cpu`` figures) to measured op times.

Profiles every sample model with ``--measure`` (each aten op of the step timed for real, the
median of several steps) and fits five figures: fp32 matmul FLOP/s, attention FLOP/s, memory
bandwidth, the rate random-number kernels fill memory at, and the fixed cost per op call. The
fit makes the roofline's time of each phase of each step (a block's forward, its backward,
the optimizer step) match the measured one: least squares on the logarithm, so a short
block's error counts as much as a long one's. Also
reports the policy cost per op call that ``--measure`` found on each model.

    python benchmarks/calibrate_cpu.py [--models gpt mlp] [--threads 1]

Copy the fitted figures into ``ckptplan/devices.py`` by hand (they are defaults every user
gets; a refit is a reviewed change). Writes benchmarks/results/cpu_calibration.json.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

import ckptplan
from ckptplan.devices import op_kind
from ckptplan.profiling.memtrack import keep_freed_host_memory
from ckptplan.values.profile_types import OpRecord

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "cpu_calibration.json"
MODELS = ("mlp", "gpt", "resnet", "unet", "vit")
NAMES = ("matmul_flops", "attention_flops", "bandwidth", "random_bandwidth", "launch")


@dataclass(frozen=True)
class Phase:
    """One phase's ops, as the fit sees them: (kind, FLOPs, bytes moved) and the measured sum."""

    label: str
    ops: tuple[tuple[str, float, float], ...]
    measured: float


def phases(records: Sequence[OpRecord], model: str) -> list[Phase]:
    grouped: dict[str, list[OpRecord]] = defaultdict(list)
    for op in records:
        grouped[op.phase].append(op)
    return [
        Phase(
            f"{model} {label}",
            tuple(
                ("random" if op.random else op_kind(op.op), op.flops, float(op.moved_bytes))
                for op in ops
            ),
            sum(op.time for op in ops),
        )
        for label, ops in grouped.items()
        if sum(op.time for op in ops) > 0
    ]


def predicted(phase: Phase, figures: dict[str, float]) -> float:
    rates = {"matmul": figures["matmul_flops"], "attention": figures["attention_flops"]}
    total = 0.0
    for kind, flops, moved in phase.ops:
        compute = flops / rates[kind] if kind in rates else 0.0
        stream = figures["random_bandwidth" if kind == "random" else "bandwidth"]
        total += figures["launch"] + max(compute, moved / stream)
    return total


def loss(all_phases: Sequence[Phase], figures: dict[str, float]) -> float:
    return statistics.fmean(math.log(predicted(p, figures) / p.measured) ** 2 for p in all_phases)


def fit(all_phases: Sequence[Phase], start: dict[str, float]) -> dict[str, float]:
    """Coordinate descent in log space, halving the step when no coordinate improves."""
    figures = dict(start)
    best = loss(all_phases, figures)
    step = 1.0
    while step > 0.01:
        improved = False
        for name in NAMES:
            for factor in (math.exp(step), math.exp(-step)):
                trial = {**figures, name: figures[name] * factor}
                value = loss(all_phases, trial)
                if value < best:
                    figures, best, improved = trial, value, True
        if not improved:
            step /= 2
    return figures


def main() -> None:
    keep_freed_host_memory()  # steady CPU step times; the library leaves malloc alone
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    all_phases: list[Phase] = []
    policy_costs = {}
    for name in args.models:
        profile = ckptplan.profile(ROOT / "sample_models" / f"{name}.py", measure=True)
        all_phases += phases(profile.ops, name)
        policy_costs[name] = profile.policy_op_time
    start = {
        "matmul_flops": 1e11,
        "attention_flops": 1e11,
        "bandwidth": 1e10,
        "random_bandwidth": 1e10,
        "launch": 4e-6,
    }
    figures = fit(all_phases, start)
    errors = sorted(predicted(p, figures) / p.measured - 1 for p in all_phases)
    result = {
        "figures": figures,
        "rms_log_error": math.sqrt(loss(all_phases, figures)),
        "phase_error_quartiles": statistics.quantiles(errors, n=4),
        "phases": len(all_phases),
        "policy_op_time": policy_costs,
        "threads": args.threads,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
