"""The autograd engine's sums of gradients, which a dispatch mode turns out of place.

When several gradients reach one input of a backward node (a weight used at every step of a
loop, a tensor read slice by slice), the engine sums them in that node's input buffer
(``InputBuffer::accumulate``). On plain tensors it adds in place, ``old.add_(new)``, when the
buffer holds the only reference to ``old`` and to its storage. It adds out of place,
``old + new``, whenever ``isTensorSubclassLike`` holds: for every tensor while any Python
dispatch mode is active, and for fake tensors always. So the profiler's own modes make the
step hold one buffer more at each such sum than the real step does (a pass-through mode alone
raised a probe's allocator peak from 3.0 to 4.0 MiB). ``LiveStorageTracker`` counts the sum
as the real engine makes it: where ``old`` dies as soon as the sum replaces it, in place.

Example:
    >>> w = torch.randn(4, requires_grad=True)
    >>> seen = []
    >>> class Watch(torch.utils._python_dispatch.TorchDispatchMode):
    ...     def __torch_dispatch__(self, func, types, args=(), kwargs=None):
    ...         out = func(*args, **(kwargs or {}))
    ...         seen.append(engine_sum_operand(func, args, kwargs or {}, out) is not None)
    ...         return out
    >>> with Watch():
    ...     (w * 2 + w * 3).sum().backward()
    >>> sum(seen)
    1
"""

from __future__ import annotations

from typing import Any

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false as dense


def engine_sum_operand(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
) -> torch.Tensor | None:
    """The first operand of ``out = func(*args)`` when the op may be the engine summing two
    gradients bound for one input, which the real engine would add into that operand if
    nothing else holds it; None for any other op.

    The sum runs in backward (a node is being evaluated) with grad mode off, as ``old + new``
    of two dense tensors of one shape and dtype; whether nothing else holds ``old`` is for
    the caller to see (its storage dies as the sum replaces it).
    """
    if func is not torch.ops.aten.add.Tensor or len(args) != 2 or kwargs.get("alpha", 1) != 1:
        return None
    if torch.is_grad_enabled() or torch._C._current_autograd_node() is None:
        return None
    old, new = args
    if not all(isinstance(t, torch.Tensor) for t in (old, new, out)):
        return None
    same = old.shape == new.shape == out.shape and old.dtype == new.dtype == out.dtype
    if not same or not dense(old):
        return None
    if old.untyped_storage().nbytes() != out.untyped_storage().nbytes():
        return None  # a view into a larger storage: the real engine adds it out of place
    return old
