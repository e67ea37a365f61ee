"""The attention kernels a CUDA GPU runs, for profiling a plan for that GPU on a CPU.

``scaled_dot_product_attention`` picks a fused kernel by device. On a CUDA GPU, flash
attention (fp16/bf16, no mask, head size a multiple of 8 up to 256) and otherwise the
memory-efficient kernel (any float dtype, a mask as an additive bias) save the output and one
logsumexp per query row: O(sequence) memory. The CPU build runs its own fused kernel only
without a mask, and otherwise the math path, which saves the O(sequence²) attention weights.
A plan for a GPU made on a laptop must see the GPU's kernels, so while such a plan is profiled
or fake-run, each call goes to the op the GPU would choose, in torch's order (flash, then
memory-efficient, then math). Their fake kernels run in the CPU-only build, forward and
backward, with the saved tensors and the backward workspace of the real ones. (cuDNN
attention, which some torch releases prefer on H100, saves the same O(sequence) tensors.)

Plans then name the GPU's ops (``aten._scaled_dot_product_flash_attention``), so they apply
unchanged there; ``GPU_ONLY_OPS`` lets ``apply`` refuse such a plan where they never run. It
lives with the runtime because an applied region re-enters ``GpuAttention`` when it recomputes
(a fake run of such a plan), and training must not import the profiler for it.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten
FLASH = aten._scaled_dot_product_flash_attention.default
EFFICIENT = aten._scaled_dot_product_efficient_attention.default
GPU_ONLY_OPS = frozenset({str(FLASH), str(EFFICIENT)})
"""Ops a selective policy may name that only a CUDA device runs."""
_ACTIVE: ContextVar[int] = ContextVar("ckptplan_gpu_kernels", default=0)
"""How many ``GpuAttention`` are entered. Counted here, not read off torch's mode stack: the
stack has no public reader, and a mode is off it while it handles a call, where code below
dispatch (``rnn``, sizing cuDNN's reserve) still asks."""


class GpuAttention(TorchFunctionMode):
    """While active, ``scaled_dot_product_attention`` runs the kernel a CUDA GPU would."""

    def __enter__(self) -> GpuAttention:
        self._token = _ACTIVE.set(_ACTIVE.get() + 1)
        return super().__enter__()  # type: ignore[no-any-return]

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        _ACTIVE.reset(self._token)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            out = _fused(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def _fused(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor | None:
    """The output of the fused kernel the GPU would pick; None where it would run math."""
    head = query.shape[-1]
    if query.dim() != 4 or head % 8 or head > 256 or not query.is_floating_point():
        return None
    if key.shape[1] != query.shape[1]:
        if not enable_gqa:
            return None
        repeats = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(repeats, 1), value.repeat_interleave(repeats, 1)
    if attn_mask is None and query.dtype in (torch.float16, torch.bfloat16):
        return FLASH(query, key, value, dropout_p, is_causal, scale=scale)[0]
    bias = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            bias = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device)
            bias = bias.masked_fill(attn_mask.logical_not(), -math.inf)
        else:
            bias = attn_mask.to(query.dtype)
        bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    return EFFICIENT(query, key, value, bias, grad, dropout_p, is_causal, scale=scale)[0]


def emulated() -> bool:
    """Whether ``GpuAttention`` is active. A recomputation runs inside ``backward``, where
    torch-function modes are off, so a checkpointed region re-enters it there when it was
    active in forward (as torch's checkpoint does for a device context)."""
    return bool(_ACTIVE.get())


def runs_gpu_kernels(tensor: torch.Tensor) -> bool:
    """Whether ops on ``tensor`` run a CUDA device's kernels (or are profiled as if they did)."""
    return tensor.is_cuda or emulated()
