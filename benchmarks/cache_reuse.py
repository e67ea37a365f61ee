"""How much faster a kernel reads what the kernel before it just wrote (the CPU's cache
figures in ``ckptplan.devices``, Note [recompute reads from cache] in
``ckptplan.stepping.graphcost``).

For each buffer size, one thread times ``y = x * 2`` twice: right after a kernel wrote ``x``
and ``y`` (both in cache, as a value recomputed in backward and read by the next kernel) and
right after a kernel streamed 256 MiB elsewhere (both in memory, as a value saved in forward
and read in backward). Bandwidth counts the bytes read and written, as the roofline does. The
cache size is the largest buffer whose hot reads still run at least 1.5 times the cold
ones, counting both buffers.

    python benchmarks/cache_reuse.py

Copy the figures into ``ckptplan/devices.py`` by hand, as ``calibrate_cpu.py``'s. Writes
benchmarks/results/cache_reuse.json.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "cache_reuse.json"
SIZES_MIB = (0.5, 1, 2, 4, 8, 16, 32, 64)
REPEATS = 21


def bandwidth(mib: float, hot: bool) -> float:
    """Bytes per second ``y = x * 2`` moves on ``mib``-MiB buffers, hot or cold."""
    x = torch.randn(int(mib * 2**20) // 4)
    y = torch.empty_like(x)
    flush = torch.empty(64 * 2**20)
    seconds = []
    for _ in range(REPEATS):
        if hot:
            torch.mul(x, 1.0, out=y)
        else:
            flush.add_(1.0)
        start = time.perf_counter()
        torch.mul(x, 2.0, out=y)
        seconds.append(time.perf_counter() - start)
    return 2 * x.numel() * 4 / statistics.median(seconds)


def main() -> None:
    torch.set_num_threads(1)
    rows = [
        {"mib": mib, "hot": bandwidth(mib, True), "cold": bandwidth(mib, False)}
        for mib in SIZES_MIB
    ]
    cached = [r for r in rows if r["hot"] >= 1.5 * r["cold"]]
    figures = {
        "cache_bytes": int(2 * max(r["mib"] for r in cached) * 2**20) if cached else 0,
        "cache_bandwidth": statistics.median(r["hot"] for r in cached) if cached else 0.0,
        "memory_bandwidth": statistics.median(r["cold"] for r in rows if r["mib"] >= 8),
    }
    for r in rows:
        print(f"{r['mib']:5g} MiB  hot {r['hot'] / 1e9:5.1f} GB/s  cold {r['cold'] / 1e9:5.1f}")
    print(
        {
            k: round(v / 2**20) if k == "cache_bytes" else f"{v / 1e9:.1f} GB/s"
            for k, v in figures.items()
        }
    )
    RESULTS.write_text(
        json.dumps({"figures": figures, "sizes": rows, "threads": 1}, indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
