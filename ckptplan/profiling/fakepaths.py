"""Where a fake step would run other ops than the real one, and what makes them the same.

Every figure ckptplan predicts comes from a step on fake tensors, so the fake step must run
the real step's ops (``ckptplan.profiling.opsequence`` checks that, op for op). Two kinds of
difference are known and corrected here, while ``real_step_paths`` is active:

- **Library questions about tensor values.** transformers asks whether the position ids pack
  several sequences into one row (``find_packed_sequence_indices``): in the real step the
  positions the model makes itself (an ``arange`` per row) never do, so it builds no mask and
  attention runs causal; on fake tensors it assumes they might, and every decoder builds a
  full float mask that attention then saves (64 KiB on a 128-token GPT-2, 2.5 MiB over a
  4-layer Gemma). Here the question gets the real step's answer. The real step still runs the
  dozen small integer ops that compute it (16 KiB, at the start of forward): those are marked
  (``answering``) so that the op-sequence check can leave them out. Positions given in the
  batch keep the library's behaviour (their values are unknown). The library calls its own
  module global, so the answer is a process-wide patch, under ``patching``'s lock (Note
  [process-wide patches]).
- **Fake kernels that lay out their output otherwise than the CPU kernel.** The CPU kernel of
  ``native_layer_norm_backward`` returns a contiguous gradient; its fake kernel copies the
  layout of the incoming gradient, which after a transpose is not contiguous, so a later
  ``reshape`` copies on fake tensors (200 KiB a stage on Swin) where the real step takes a view.
  Here such outputs get the CPU kernel's strides (a view: nothing is allocated).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ckptplan.huggingface import MASKING_MODULE, PACKED_SEQUENCES, gives_positions
from ckptplan.patching import patched

_ANSWERING: ContextVar[bool] = ContextVar("ckptplan_answering", default=False)

CONTIGUOUS_ON_CPU = frozenset({torch.ops.aten.native_layer_norm_backward.default})
"""Ops whose CPU kernel returns contiguous tensors where their fake kernel may not."""


def answering() -> bool:
    """Whether the real step is running a library question the fake step answers unrun."""
    return _ANSWERING.get()


@contextmanager
def real_step_paths(inputs: Any, compiled: bool = False) -> Iterator[None]:
    """While active, the fake step takes the real step's paths for ``inputs`` (see above).

    A ``compiled`` step takes its paths as it is: its layouts are inductor's, not the CPU
    kernels', and the library asks its question of a traced tensor, which it answers itself
    the same way on fake and real tensors (transformers builds the mask when it traces).
    Answering it here would graph-break the fake step where the real one does not.
    """
    with ExitStack() as stack:
        if not compiled:
            if any(isinstance(t, FakeTensor) for t in pytree.tree_leaves(inputs)):
                stack.enter_context(_CpuLayouts())
            stack.enter_context(_one_sequence_per_row(inputs))
        yield


@contextmanager
def _one_sequence_per_row(inputs: Any) -> Iterator[None]:
    masking = sys.modules.get(MASKING_MODULE)
    original = getattr(masking, PACKED_SEQUENCES, None)
    if original is None or gives_positions(inputs):
        yield
        return

    def answered(position_ids: Any) -> Any:
        if isinstance(position_ids, FakeTensor):
            return None
        token = _ANSWERING.set(True)
        try:
            return original(position_ids)
        finally:
            _ANSWERING.reset(token)

    with patched(masking, PACKED_SEQUENCES, answered):
        yield


class _CpuLayouts(TorchDispatchMode):
    """Gives the outputs of ``CONTIGUOUS_ON_CPU`` ops the CPU kernel's contiguous strides."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func not in CONTIGUOUS_ON_CPU:
            return out
        return pytree.tree_map_only(torch.Tensor, _contiguous_view, out)


def _contiguous_view(t: torch.Tensor) -> torch.Tensor:
    if t.is_contiguous():
        return t
    strides, step = [], 1
    for size in reversed(t.shape):
        strides.append(step)
        step *= max(size, 1)
    return t.as_strided(t.shape, tuple(reversed(strides)), t.storage_offset())
