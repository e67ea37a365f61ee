"""FLOPs and bytes moved per aten op, attributed to the phase of the step that runs it.

The flop counter of ``torch.utils.flop_counter`` knows matmuls and convolutions; CPU attention
(``_scaled_dot_product_flash_attention_for_cpu``) is added here. Pointwise and normalisation ops
count 0 FLOPs, so the bytes they move carry their time in the roofline estimate.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from ckptplan.devices import Device


def _sdpa_cpu_flops(args: tuple[Any, ...], backward: bool) -> float:
    query, key = args[1 if backward else 0], args[2 if backward else 1]
    *batch, lq, d = query.shape
    lk = key.shape[-2]
    n = 1
    for b in batch:
        n *= b
    forward = 4.0 * n * lq * lk * d
    return 2.5 * forward if backward else forward


def op_flops(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> float:
    packet = func._overloadpacket
    if packet in flop_registry:
        return float(flop_registry[packet](*args, **kwargs, out_val=out))
    name = packet.__name__
    if name.startswith("_scaled_dot_product_flash_attention_for_cpu"):
        return _sdpa_cpu_flops(args, backward=name.endswith("backward"))
    return 0.0


def _tensor_bytes(tree: Any) -> int:
    return sum(
        t.numel() * t.element_size()
        for t in pytree.tree_leaves(tree)
        if isinstance(t, torch.Tensor)
    )


class OpCostMode(TorchDispatchMode):
    """Sums FLOPs and roofline time per phase label; ``phase`` is set by the caller's hooks."""

    def __init__(self, device: Device) -> None:
        super().__init__()
        self.device = device
        self.phase = "start"
        self.flops: dict[str, float] = defaultdict(float)
        self.time: dict[str, float] = defaultdict(float)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view:
            return out
        flops = op_flops(func, args, kwargs, out)
        moved = _tensor_bytes(args) + _tensor_bytes(out)
        half = any(
            isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16)
            for t in pytree.tree_leaves(out)
        )
        self.flops[self.phase] += flops
        self.time[self.phase] += self.device.op_time(flops, moved, half)
        return out
