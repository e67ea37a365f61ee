"""Plan time and peak RSS of ``ckptplan solve`` at scale: the Llama-2-7B, Llama-2-70B and
Llama-3-405B shapes (Hugging Face ``LlamaForCausalLM`` from their configs,
``benchmarks/models/llama_shapes.py``), at 4k, 32k and 128k tokens, FSDP over 8 and 64 ranks,
bf16, planned for an H100 (its attention kernels: memory linear in the sequence), with the
default solver (``auto``) beside ``dp``.

Each row runs the CLI as a user would, in a subprocess, so the figures include interpreter
start-up and the import of torch and transformers, and the peak RSS is that process's alone:

    ckptplan solve benchmarks.models.llama_shapes:llama2_70b_4k --budget 80GiB --target h100 \\
        --dtype bf16 --world-size 8 --fsdp --json

Peak RSS comes from ``/usr/bin/time -v`` when it exists, else from
``getrusage(RUSAGE_CHILDREN)`` (the largest child so far). The budget is an H100's 80 GiB
(less the 3% margin). Targets (issue 15, two cores): the 70B shape at 4k tokens over 8 ranks
in 60 s and under 4 GiB, the 405B shape at 4k tokens over 64 ranks in 120 s (over 8, its bf16
weights, gradients and AdamW state alone need 377 GiB a rank), the 7B shape at 4k tokens in
15 s. A row whose budget is below its least feasible peak is solved again at the budget the
refusal names (the refusal kept beside it), the solver's hardest point; a row that fails,
runs past ``--timeout`` or cannot be built yet records why instead of figures.

    python benchmarks/scale.py                          # every row (an hour or more)
    python benchmarks/scale.py --only llama2_70b-4k-fsdp8

Writes benchmarks/results/scale.json, rows merged by name, so a run of some rows keeps the
others'; exits 1 when a row that has a target misses it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "scale.json"
SHAPES = "benchmarks.models.llama_shapes"
GNU_TIME = "/usr/bin/time"
GIB = 2**30
TOKENS = {"4k": 4096, "32k": 32768, "128k": 131072}


@dataclass(frozen=True)
class Row:
    """One configuration: a shape at a sequence length, how the ranks hold it, a solver."""

    shape: str
    tokens: str
    ranks: int
    solver: str = "auto"
    parallel: str = "fsdp"
    target_seconds: float | None = None
    target_rss_bytes: int | None = None
    pipeline: tuple[int, int, str, int] | None = None
    """Pipeline stages, microbatches, schedule and batch; ``ranks`` is then FSDP in a stage."""

    @property
    def name(self) -> str:
        suffix = "" if self.solver == "auto" else f"-{self.solver}"
        if self.pipeline is not None:
            stages, microbatches, schedule, _ = self.pipeline
            suffix += f"-pipeline{stages}x{microbatches}-{schedule}"
        return f"{self.shape}-{self.tokens}-{self.parallel}{self.ranks}{suffix}"

    def command(self, budget: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "ckptplan",
            "solve",
            f"{SHAPES}:{self.shape}_{self.tokens}",
            "--budget",
            budget,
            "--solver",
            self.solver,
            "--target",
            "h100",
            "--dtype",
            "bf16",
            "--world-size",
            str(self.ranks),
            f"--{self.parallel}",
            *self.pipeline_flags(),
            "--json",
        ]

    def pipeline_flags(self) -> list[str]:
        if self.pipeline is None:
            return []
        stages, microbatches, schedule, batch = self.pipeline
        return [
            *("--pipeline-stages", str(stages), "--microbatches", str(microbatches)),
            *("--schedule", schedule, "--batch-size", str(batch)),
        ]


def rows() -> list[Row]:
    """Every row, the ones with targets first."""
    out = [
        Row("llama2_70b", "4k", 8, target_seconds=60.0, target_rss_bytes=4 * GIB),
        Row("llama2_70b", "4k", 8, solver="dp"),
        Row("llama2_7b", "4k", 8, target_seconds=15.0),
        Row("llama3_405b", "4k", 64, target_seconds=120.0),
    ]
    for shape in ("llama2_7b", "llama2_70b", "llama3_405b"):
        for tokens in TOKENS:
            for ranks in (8, 64):
                row = Row(shape, tokens, ranks)
                if all(r.name != row.name for r in out):
                    out.append(row)
    # 8 stages of FSDP over 8 (64 GPUs), 16 microbatches of one sequence, 1F1B.
    out.append(Row("llama3_405b", "4k", 8, pipeline=(8, 16, "1f1b", 16)))
    out.append(Row("llama2_70b", "4k", 8, pipeline=(4, 8, "1f1b", 8)))
    return out


def run_row(row: Row, budget: str, timeout: float) -> dict[str, Any]:
    """Run one row's ``ckptplan solve --json``: wall time, peak RSS and what the plan says."""
    command = row.command(budget)
    use_time = shutil.which(GNU_TIME) is not None
    wrapped = [GNU_TIME, "-v", *command] if use_time else command
    result: dict[str, Any] = {
        "name": row.name,
        "command": " ".join(["ckptplan", *command[3:]]),
        "tokens": TOKENS[row.tokens],
        "ranks": row.ranks,
        "solver": row.solver,
    }
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            wrapped, cwd=ROOT, capture_output=True, text=True, check=False, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        result["skipped"] = f"ran past --timeout {timeout:g} s on this machine"
        return result
    result["wall_seconds"] = round(time.perf_counter() - started, 2)
    if use_time:
        match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
        result["peak_rss_bytes"] = int(match[1]) * 1024 if match else None
    else:
        result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    result["returncode"] = proc.returncode
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if "error:" in line]
        result["error"] = errors[-1] if errors else proc.stderr.strip()[-500:]
        return result
    solved = json.loads(proc.stdout)
    plan = solved["plan"]
    if "stages" in solved:
        stages = solved["stages"]
        return {
            **result,
            "blocks": len(plan["blocks"]),
            "parameters": plan["fingerprint"]["parameters"],
            "budget_bytes": solved["budget_bytes"],
            "predicted_peak_bytes": max(st["predicted_peak_bytes"] for st in stages),
            "stages": [
                {
                    "index": st["index"],
                    "in_flight": st["in_flight"],
                    "predicted_peak_bytes": st["predicted_peak_bytes"],
                    "regions": len(st["regions"]),
                }
                for st in stages
            ],
        }
    result.update(
        blocks=len(plan["blocks"]),
        parameters=plan["fingerprint"]["parameters"],
        budget_bytes=solved["budget_bytes"],
        predicted_peak_bytes=solved["predicted_peak_bytes"],
        unchecked_peak_bytes=plan["baselines"]["none"]["peak_bytes"],
        full_checkpoint_peak_bytes=plan["baselines"]["full"]["peak_bytes"],
        predicted_overhead=solved["predicted_overhead"],
        regions=len(solved["regions"]),
    )
    return result


SUGGESTED = re.compile(r"use --budget (\S+) or more")


def run_at_least(row: Row, budget: str, timeout: float) -> dict[str, Any]:
    """``run_row``; where the budget is below the least feasible peak, the row solved again
    at the budget the refusal names (beside the refusal): the solver's hardest point."""
    result = run_row(row, budget, timeout)
    suggested = SUGGESTED.search(result.get("error", ""))
    if suggested is None:
        return result
    retry = run_row(row, suggested[1], timeout)
    return {**retry, "budget": suggested[1], "refused": {"budget": budget, **result}}


def judged(row: Row, result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with whether it meets the row's targets (None: the row has none)."""
    if row.target_seconds is None:
        return {**result, "meets_targets": None}
    meets = result.get("returncode") == 0 and result["wall_seconds"] <= row.target_seconds
    if row.target_rss_bytes is not None:
        meets = meets and (result["peak_rss_bytes"] or 0) < row.target_rss_bytes
    targets = {"target_seconds": row.target_seconds, "target_rss_bytes": row.target_rss_bytes}
    return {**result, **targets, "meets_targets": meets}


def describe(result: dict[str, Any]) -> str:
    if "skipped" in result:
        return f"{result['name']}: skipped ({result['skipped']})"
    line = f"{result['name']} at {result['budget']}: {result['wall_seconds']:.1f} s"
    if result.get("peak_rss_bytes"):
        line += f", peak RSS {result['peak_rss_bytes'] / GIB:.2f} GiB"
    if "error" in result:
        return f"{line}; failed: {result['error']}"
    line += (
        f"; {result['blocks']} blocks, predicted peak "
        f"{result['predicted_peak_bytes'] / GIB:.1f} GiB of {result['budget_bytes'] / GIB:.1f}"
    )
    if "stages" in result:
        return f"{line} (the highest of {len(result['stages'])} stages)"
    return f"{line}, overhead {result['predicted_overhead']:.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="80GiB", help="per rank, as ckptplan solve takes it")
    parser.add_argument("--only", nargs="*", help="row names to run (default: every row)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per row")
    parser.add_argument(
        "--note", default="what else ran on the machine was not stated", help="for the results"
    )
    args = parser.parse_args()
    chosen = [r for r in rows() if not args.only or r.name in args.only]
    if args.only and len(chosen) != len(args.only):
        known = ", ".join(r.name for r in rows())
        parser.error(f"unknown row in --only; rows: {known}")
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    merged = {r["name"]: r for r in previous.get("rows", [])}
    failed = False
    for row in chosen:
        solved = run_at_least(row, args.budget, args.timeout)
        result = judged(row, {"budget": args.budget, **solved})
        merged[row.name] = result
        failed = failed or result["meets_targets"] is False
        print(describe(result), flush=True)
    for row in rows():
        merged.setdefault(
            row.name, {"name": row.name, "skipped": f"not run yet: --only {row.name}"}
        )
    order = [r.name for r in rows()]
    out = {
        "rows": [merged[name] for name in order if name in merged],
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "note": args.note,
        },
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"results written to {RESULTS.relative_to(ROOT)}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
