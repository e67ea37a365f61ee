"""How much faster a kernel reads what the kernel before it just wrote (the CPU's cache
figures in ``ckptplan.devices``, Note [recompute reads from cache] in
``ckptplan.stepping.kernelcost``).

For each buffer size, one thread times ``y = x * 2`` twice: right after a kernel wrote ``x``
and ``y`` (both in cache, as a value recomputed in backward and read by the next kernel) and
right after a kernel streamed 256 MiB elsewhere (both in memory, as a value saved in forward
and read in backward). Bandwidth counts the bytes read and written, as the roofline does. The
cache size is the largest buffer whose hot reads still run at least 1.5 times the cold
ones, counting both buffers.

Then what a kernel's write costs where its buffer is not in the cache: one thread times
``y = x * 2`` with ``x`` just written both times and ``y`` just written or in memory (a fresh
output, such as a value a forward graph saves). The CPU fetches a line before it writes it,
so the cold write adds about its bytes' time again: the write-allocate share is that extra
time as a share of ``y``'s bytes' time at the cold bandwidth. Its figure is for a buffer
256 MiB of traffic stale; the same share for 16 MiB buffers by how many MiB were streamed
since ``y`` was touched (16 MiB to 1 GiB) shows how stale a buffer must be to cost it whole.

Then the same for library calls: one thread times the matmuls of a linear layer's forward and
backward at the shapes of the HF Llama and ViT benchmark models, with every operand just
written and with every operand in memory. A GEMM on the CPU packs its operands into blocks
before it multiplies them, in a pass of its own, so what the cold call adds is not hidden
behind its FLOPs: the stall is that extra time as a share of the cold bytes' time at the
cold bandwidth measured above.

    python benchmarks/cache_reuse.py

Copy the figures into ``ckptplan/devices.py`` by hand, as ``calibrate_cpu.py``'s. Writes
benchmarks/results/cache_reuse.json.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "cache_reuse.json"
SIZES_MIB = (0.5, 1, 2, 4, 8, 16, 32, 64)
TRAFFIC_MIB = (16, 64, 128, 256, 512, 1024)
REPEATS = 21


def hot_and_cold(
    call: Callable[[], Any],
    warm: Callable[[], Any],
    ready: Callable[[], Any] = lambda: None,
    flush_mib: int = 256,
) -> dict[bool, float]:
    """Median seconds of ``call``, keyed by hot: right after ``warm`` (which writes what it
    should find in the cache) and right after a kernel streamed ``flush_mib`` MiB elsewhere;
    ``ready`` runs just before it either way."""
    flush = torch.empty(flush_mib * 2**20 // 4)
    seconds = {}
    for hot in (True, False):
        times = []
        for _ in range(REPEATS):
            if hot:
                warm()
            else:
                flush.add_(1.0)
            ready()
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        seconds[hot] = statistics.median(times)
    return seconds


def bandwidth(mib: float) -> dict[bool, float]:
    """Bytes per second ``y = x * 2`` moves on ``mib``-MiB buffers, keyed by hot."""
    x = torch.randn(int(mib * 2**20) // 4)
    y = torch.empty_like(x)
    seconds = hot_and_cold(lambda: torch.mul(x, 2.0, out=y), lambda: torch.mul(x, 1.0, out=y))
    return {hot: 2 * x.numel() * 4 / s for hot, s in seconds.items()}


def write_allocate(mib: float, cold_bandwidth: float, flush_mib: int = 256) -> float:
    """The seconds ``y = x * 2`` adds, ``x`` in the cache, where ``y`` was last touched
    ``flush_mib`` MiB of traffic ago rather than just written, as a share of ``y``'s bytes'
    time at ``cold_bandwidth``."""
    x = torch.randn(int(mib * 2**20) // 4)
    y = torch.empty_like(x)
    # x is just written either way: only where y is differs.
    seconds = hot_and_cold(
        lambda: torch.mul(x, 2.0, out=y),
        warm=lambda: y.mul_(1.0),
        ready=lambda: x.mul_(1.0),
        flush_mib=flush_mib,
    )
    return (seconds[False] - seconds[True]) * cold_bandwidth / (x.numel() * 4)


# (rows, inner, outer): a linear layer over ``rows`` tokens from ``inner`` to ``outer`` features.
LINEARS = {
    "llama mlp": (1024, 256, 688),
    "llama attention": (1024, 256, 256),
    "vit mlp": (1154, 192, 768),
}


def stall(rows: int, inner: int, outer: int, cold_bandwidth: float) -> list[float]:
    """Per matmul of a linear layer (forward, input gradient, weight gradient), its cold
    call's extra seconds over its hot call's, as a share of its bytes' time at
    ``cold_bandwidth``."""
    x, w, dy = torch.randn(rows, inner), torch.randn(outer, inner), torch.randn(rows, outer)
    shares = []
    for a, b in ((x, w.t()), (dy, w), (dy.t(), x)):
        moved = (a.numel() + b.numel() + a.shape[0] * b.shape[1]) * 4
        seconds = hot_and_cold(
            lambda a=a, b=b: torch.mm(a, b), lambda a=a, b=b: (a.mul_(1.0), b.mul_(1.0))
        )
        shares.append((seconds[False] - seconds[True]) * cold_bandwidth / moved)
    return shares


def main() -> None:
    torch.set_num_threads(1)
    rows = []
    for mib in SIZES_MIB:
        rates = bandwidth(mib)
        rows.append({"mib": mib, "hot": rates[True], "cold": rates[False]})
    cached = [r for r in rows if r["hot"] >= 1.5 * r["cold"]]
    figures = {
        "cache_bytes": int(2 * max(r["mib"] for r in cached) * 2**20) if cached else 0,
        "cache_bandwidth": statistics.median(r["hot"] for r in cached) if cached else 0.0,
        "memory_bandwidth": statistics.median(r["cold"] for r in rows if r["mib"] >= 8),
    }
    allocating = {mib: write_allocate(mib, figures["memory_bandwidth"]) for mib in (2, 4, 8, 16)}
    figures["write_allocate"] = statistics.median(allocating.values())
    since = {flush: write_allocate(16, figures["memory_bandwidth"], flush) for flush in TRAFFIC_MIB}
    stalls = {name: stall(*shape, figures["memory_bandwidth"]) for name, shape in LINEARS.items()}
    figures["library_stall"] = statistics.median(s for shares in stalls.values() for s in shares)
    for r in rows:
        print(f"{r['mib']:5g} MiB  hot {r['hot'] / 1e9:5.1f} GB/s  cold {r['cold'] / 1e9:5.1f}")
    print(
        "write-allocate of 16 MiB by MiB streamed since:",
        {k: round(v, 2) for k, v in since.items()},
    )
    print(
        f"cache {figures['cache_bytes'] / 2**20:.0f} MiB at "
        f"{figures['cache_bandwidth'] / 1e9:.1f} GB/s, memory "
        f"{figures['memory_bandwidth'] / 1e9:.1f} GB/s, write-allocate "
        f"{figures['write_allocate']:.2f}, library stall {figures['library_stall']:.2f}"
    )
    RESULTS.write_text(
        json.dumps(
            {
                "figures": figures,
                "sizes": rows,
                "write_allocate_by_mib": allocating,
                "write_allocate_by_traffic_since_mib": since,
                "library_stalls": stalls,
                "threads": 1,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
