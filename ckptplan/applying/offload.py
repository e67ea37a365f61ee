"""Offload in eager mode: a region's policy moves op outputs to host memory in forward and
brings them back when backward recomputes the region.

Eager torch recomputes what a ``MUST_CPU_OFFLOAD`` policy names, so a region that offloads runs
these caching dispatch modes instead of torch's selective-checkpoint contexts (under
``torch.compile`` the partitioner takes the policy itself). What the policy saves is cached too,
with its version, so an in-place change since forward is refused rather than used.

Two names here are torch's own and not in its public API, for want of one (torch 2.11 to 2.14):
``TorchDispatchMode``, whose only home is ``torch.utils._python_dispatch`` (torch's "Extending
PyTorch" notes and ``torch.library`` name it there), and ``Tensor._version``, the version
counter torch's own selective checkpoint checks its cached outputs by. A plan without offload
never runs them, but this module is imported with every region.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only
from torch.utils.checkpoint import SAC_IGNORED_OPS, CheckpointPolicy

from ckptplan.applying.policy import Choices, OpCalls


@dataclass(frozen=True)
class _Offloaded:
    """A saved output moved off the device: a pinned host copy, or a data-less tensor's layout."""

    host: torch.Tensor | None
    size: torch.Size
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device


@dataclass(frozen=True)
class _Kept:
    """A saved output and its version, to refuse one an in-place op changed since."""

    tensor: torch.Tensor
    version: int


def _keep(t: torch.Tensor) -> _Kept:
    return _Kept(t.detach(), t._version)


def _to_host(t: torch.Tensor) -> _Kept | _Offloaded:
    """Move ``t`` off its device. On a CPU it is host memory already and stays. A tensor with no
    data behind it (a fake run's, whose storage is on ``meta``) keeps only its layout, so the
    run counts no device bytes for it until it returns."""
    if t.untyped_storage().device.type == "meta":
        return _Offloaded(None, t.size(), t.stride(), t.dtype, t.device)
    if t.device.type == "cpu":
        return _keep(t)
    host = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return _Offloaded(host, t.size(), t.stride(), t.dtype, t.device)


def _restore(value: Any) -> Any:
    """A cached output as recompute returns it: on the device, unchanged since forward."""
    if isinstance(value, _Kept):
        if value.tensor._version != value.version:
            raise RuntimeError(
                "ckptplan: an op output the plan keeps was modified in place after forward; "
                "re-solve the plan (the profile excludes such ops)"
            )
        return value.tensor
    if not isinstance(value, _Offloaded):
        return value
    if value.host is None:
        return torch.empty_strided(value.size, value.stride, dtype=value.dtype, device=value.device)
    return value.host.to(value.device, non_blocking=True)


class _OffloadingForward(TorchDispatchMode):
    """Forward of a region that offloads: keep what the policy saves, move what it offloads."""

    def __init__(self, choices: Choices, cache: dict[tuple[Any, int], Any]) -> None:
        super().__init__()
        self.choices = choices
        self.cache = cache

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in SAC_IGNORED_OPS:
            return out
        choice, index = self.choices(func, recompute=False)
        if choice is CheckpointPolicy.MUST_SAVE:
            self.cache[func, index] = tree_map_only(torch.Tensor, _keep, out)
        elif choice is CheckpointPolicy.MUST_CPU_OFFLOAD:
            self.cache[func, index] = tree_map_only(torch.Tensor, _to_host, out)
        return out


class _OffloadingRecompute(TorchDispatchMode):
    """Recompute of such a region: kept and offloaded outputs come back, the rest runs again."""

    def __init__(self, choices: Choices, cache: dict[tuple[Any, int], Any]) -> None:
        super().__init__()
        self.choices = choices
        self.cache = cache

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in SAC_IGNORED_OPS:
            return func(*args, **(kwargs or {}))
        _, index = self.choices(func, recompute=True)
        if (func, index) in self.cache:
            cached = self.cache.pop((func, index))
            return tree_map_only((torch.Tensor, _Kept, _Offloaded), _restore, cached)
        return func(*args, **(kwargs or {}))


def offload_contexts(saves: OpCalls, offloads: OpCalls) -> tuple[Any, Any]:
    """Eager contexts of a region whose policy offloads: one cache shared by forward and
    recompute, so the outputs it holds are not computed again."""
    choices = Choices(saves, offloads)
    cache: dict[tuple[Any, int], Any] = {}
    return _OffloadingForward(choices, cache), _OffloadingRecompute(choices, cache)
