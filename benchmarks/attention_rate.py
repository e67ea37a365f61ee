"""The CPU's attention rate (``ckptplan.devices``' ``cpu`` figures): the share of the matmul
rate that scaled-dot-product attention reaches on one thread.

``calibrate_cpu.py`` cannot fit it: no sample model's step calls the CPU's fused attention.
So this times ``scaled_dot_product_attention``'s forward and backward at the shapes of the
HF Llama (causal) and ViT benchmark models, counts their FLOPs as the planner does
(``op_flops``, a causal call counted whole, as the profile counts it), and divides the
achieved rate by that of the same models' linear layers (their forward matmul, operands just
written), timed in the same process: the share of the matmul rate the device's figures give
attention.

    python benchmarks/attention_rate.py

Copy the share into ``ckptplan/devices.py`` by hand, as ``calibrate_cpu.py``'s figures.
Writes benchmarks/results/attention_rate.json.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ckptplan.devices import op_kind
from ckptplan.profiling.costs import op_flops

RESULTS = Path(__file__).resolve().parent / "results" / "attention_rate.json"
# (batch, heads, tokens, head size, causal), as the benchmark models call attention, and
# (tokens, features in, features out) of their linear layers.
SHAPES = {"hf_llama_256": (4, 4, 256, 64, True), "hf_vit_384": (2, 3, 577, 64, False)}
LINEARS = {"hf_llama_256": ((1024, 256, 256), (1024, 256, 688)), "hf_vit_384": ((1154, 192, 768),)}
REPEATS = 21


class AttentionFlops(TorchDispatchMode):
    """Counts the FLOPs of the attention ops dispatched under it, as the profile does."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0.0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if op_kind(str(func)) == "attention":
            self.flops += op_flops(func, args, kwargs or {}, out)
        return out


def median_seconds(run: Callable[[], Any]) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def linear_rate(tokens: int, inner: int, outer: int) -> float:
    """FLOP/s of a linear layer's forward matmul, its operands just written."""
    x, w = torch.randn(tokens, inner), torch.randn(inner, outer)

    def run() -> None:
        x.mul_(1.0)
        torch.mm(x, w)

    touch = median_seconds(lambda: x.mul_(1.0))
    return 2 * tokens * inner * outer / (median_seconds(run) - touch)


def attention_rates(
    batch: int, heads: int, tokens: int, size: int, causal: bool
) -> dict[str, float]:
    """FLOP/s of attention's forward and of its backward at one shape."""
    q, k, v = (torch.randn(batch, heads, tokens, size, requires_grad=True) for _ in range(3))

    def forward() -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    grad = torch.randn(batch, heads, tokens, size)
    with AttentionFlops() as forward_flops:
        out = forward()
    with AttentionFlops() as backward_flops:
        out.backward(grad)
    forward_s = median_seconds(forward)
    outputs = [forward() for _ in range(REPEATS)]
    backward_s = median_seconds(lambda: outputs.pop().backward(grad))
    return {
        "forward": forward_flops.flops / forward_s,
        "backward": backward_flops.flops / backward_s,
    }


def main() -> None:
    torch.set_num_threads(1)
    matmul = statistics.median(
        linear_rate(*shape) for shapes in LINEARS.values() for shape in shapes
    )
    rates = {name: attention_rates(*shape) for name, shape in SHAPES.items()}
    shares = {
        phase: statistics.median(r[phase] / matmul for r in rates.values())
        for phase in ("forward", "backward")
    }
    for name, r in rates.items():
        print(
            f"{name}: forward {r['forward'] / 1e9:.0f} GFLOP/s, backward {r['backward'] / 1e9:.0f}"
        )
    print(f"matmul {matmul / 1e9:.0f} GFLOP/s; attention's share of it: {shares}")
    RESULTS.write_text(
        json.dumps(
            {"matmul_flops": matmul, "rates": rates, "shares": shares, "threads": 1}, indent=1
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
