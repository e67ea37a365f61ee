"""Time and memory of solving Llama-2-7B (batch 1, 4096 tokens) on fake tensors.

Runs the CLI as a user would, in a subprocess, so the figures include interpreter start-up
and the import of torch, and the peak RSS is that process's alone:

    ckptplan solve sample_models/llama7b.py --budget 80GB --target h100 --dtype bf16

Peak RSS comes from ``/usr/bin/time -v`` when it exists, else from
``getrusage(RUSAGE_CHILDREN)``. Targets: under 60 s and under 4 GiB on a two-core machine.

    python benchmarks/llama7b.py                 # the command above
    python benchmarks/llama7b.py --dtype fp32

Writes benchmarks/results/llama7b.json; exits 1 when the solve fails or misses a target.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "sample_models" / "llama7b.py"
RESULTS = ROOT / "benchmarks" / "results" / "llama7b.json"
TARGET_SECONDS = 60.0
TARGET_RSS_BYTES = 4 * 2**30
GNU_TIME = "/usr/bin/time"


def run_solve(budget: str, target: str, dtype: str) -> dict[str, Any]:
    """Run ``ckptplan solve --json`` once; wall time, peak RSS and what the plan predicts."""
    command = [
        sys.executable,
        "-m",
        "ckptplan",
        "solve",
        str(MODEL.relative_to(ROOT)),
        "--budget",
        budget,
        "--target",
        target,
        "--dtype",
        dtype,
        "--batch-size",
        "1",
        "--json",
    ]
    use_time = shutil.which(GNU_TIME) is not None
    wrapped = [GNU_TIME, "-v", *command] if use_time else command
    started = time.perf_counter()
    proc = subprocess.run(wrapped, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if use_time:
        rss_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)[1])
        rss_source = "/usr/bin/time -v"
    else:
        rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        rss_source = "getrusage(RUSAGE_CHILDREN)"
    result: dict[str, Any] = {
        "command": " ".join(["ckptplan", *command[3:]]),
        "returncode": proc.returncode,
        "wall_seconds": round(wall, 2),
        "peak_rss_bytes": rss_kib * 1024,
        "rss_source": rss_source,
    }
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        result["error"] = errors[-1] if errors else proc.stderr.strip()[-500:]
        return result
    solved = json.loads(proc.stdout)
    plan = solved["plan"]
    result.update(
        budget_bytes=solved["budget_bytes"],
        predicted_peak_bytes=solved["predicted_peak_bytes"],
        fake_run_peak_bytes=plan["predicted"].get("fake_run_peak_bytes"),
        unchecked_peak_bytes=plan["baselines"]["none"]["peak_bytes"],
        full_checkpoint_peak_bytes=plan["baselines"]["full"]["peak_bytes"],
        predicted_overhead=solved["predicted_overhead"],
        regions=len(solved["regions"]),
        blocks=len(plan["blocks"]),
        parameters=plan["fingerprint"]["parameters"],
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="80GB")
    parser.add_argument("--target", default="h100")
    parser.add_argument("--dtype", default="bf16")
    args = parser.parse_args()
    result = run_solve(args.budget, args.target, args.dtype)
    ok = result["returncode"] == 0
    result["meets_targets"] = (
        ok
        and result["wall_seconds"] < TARGET_SECONDS
        and result["peak_rss_bytes"] < TARGET_RSS_BYTES
    )
    result["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")

    gib = 2**30
    print(result["command"])
    print(
        f"wall {result['wall_seconds']:.1f} s (target < {TARGET_SECONDS:.0f} s), "
        f"peak RSS {result['peak_rss_bytes'] / gib:.2f} GiB "
        f"(target < {TARGET_RSS_BYTES / gib:.0f} GiB, {result['rss_source']})"
    )
    if ok:
        print(
            f"{result['blocks']} blocks, {result['parameters']:,} parameters; predicted peak "
            f"{result['predicted_peak_bytes'] / gib:.2f} GiB (unchecked "
            f"{result['unchecked_peak_bytes'] / gib:.2f} GiB, full checkpointing "
            f"{result['full_checkpoint_peak_bytes'] / gib:.2f} GiB), "
            f"{result['regions']} regions"
        )
    else:
        print(f"solve failed (exit {result['returncode']}): {result['error']}")
    print(f"results written to {RESULTS.relative_to(ROOT)}")
    if not result["meets_targets"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
