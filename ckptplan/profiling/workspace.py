"""Memory a CPU kernel allocates inside itself, which no dispatch-level count sees.

A convolution's CPU kernels build their im2col columns and reorder weights in buffers of their
own, allocated below the dispatcher and freed before they return. The tracker and fake
tensors see only each op's outputs, so a step whose peak falls inside such a kernel was
under-predicted: on Hugging Face's ConvNeXt by 10.6 MB (7%), in the depthwise convolution's
backward. The allocator's event stream shows them; here each such op is run once for real, on
empty tensors of the same shapes, strides and dtypes, and the allocator's peak during it (its
outputs and its buffers) is what the tracker adds to the live bytes before it, for that moment.
The figure depends on shapes, not values, so one call per distinct signature serves the whole
step. Inputs larger than ``CALIBRATION_LIMIT`` are not run (a model
too large for this machine), and their workspace is left out.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from ckptplan.profiling import rnn
from ckptplan.profiling.allocmeter import allocator_peak

aten = torch.ops.aten
WORKSPACE_OPS = frozenset(
    {
        aten.convolution.default,
        aten.convolution_backward.default,
        aten.native_dropout.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
        *rnn.CPU_KERNELS,
    }
)
"""Ops whose CPU kernels allocate buffers of their own while they run. ``native_dropout``
draws its mask in the input's dtype before returning it as booleans; eager dropout on the CPU
never calls it (its ops are visible), but inductor with ``fallback_random`` does, and the
compiled fake run was 2 MiB (9%) under the allocator on the compiled-plan tests' model.
Flash attention's CPU backward zeroes its gradients and per-thread buffers inside the kernel;
where a compiled step peaked there (Hugging Face ViT, one joined region over its layers) the
fake run was 0.52 MiB (2.1%) under the allocator, and the plan over its budget. The LSTM's
oneDNN kernels keep scratch of their own in forward and backward (``rnn``)."""
HALF_WORKSPACE_OPS = frozenset(
    {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
)
"""Ops whose CPU kernels allocate buffers of their own in bf16/fp16 (oneDNN packs the operands
for a half-precision GEMM: 26 KiB beside a 64 KiB bf16 output; nothing in fp32). Under autocast
the fake run was 3% under the allocator on the test GPT with every block checkpointed."""
CALIBRATION_LIMIT = 1 << 30
"""Bytes of inputs above which an op is not run to measure its workspace."""


class Workspaces:
    """Each op's workspace on this CPU, measured once per signature."""

    def __init__(self) -> None:
        self._known: dict[Any, int] = {}

    def peak_of(self, func: Any, args: Any, kwargs: Any) -> int:
        """Bytes the op had live above its start at its peak, outputs and buffers of its own
        together (0 for ops without workspace, whose peak is their outputs)."""
        if func not in WORKSPACE_OPS and not (func in HALF_WORKSPACE_OPS and _half(args)):
            return 0
        grad = func in rnn.CPU_KERNELS and torch.is_grad_enabled()  # they keep more with it
        key = (func, _signature((args, kwargs)), grad)
        if key not in self._known:
            self._known[key] = self._measure(func, args, kwargs, grad)
        return self._known[key]

    def _measure(self, func: Any, args: Any, kwargs: Any, grad: bool) -> int:
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if sum(t.untyped_storage().nbytes() for t in tensors) > CALIBRATION_LIMIT:
            return 0
        with _disable_current_modes(), torch.set_grad_enabled(grad):
            real_args, real_kwargs = pytree.tree_map_only(torch.Tensor, _empty_like, (args, kwargs))
            if func in rnn.CPU_KERNELS:  # zeros, and a backward's workspace from a real forward
                real_args = rnn.real_arguments(func, args)
            peak = allocator_peak(lambda: func(*real_args, **real_kwargs)).step
        return peak


def _half(args: Any) -> bool:
    return any(
        isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16)
        for t in pytree.tree_leaves(args)
    )


def _empty_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device="cpu")


def _signature(tree: Any) -> Any:
    leaves, spec = pytree.tree_flatten(tree)
    described = tuple(
        (tuple(x.shape), x.stride(), x.dtype) if isinstance(x, torch.Tensor) else x for x in leaves
    )
    return described, str(spec)
