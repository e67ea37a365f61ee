"""Live-storage accounting: the peak of a training step, on real or fake tensors alike.

A dispatch mode sees every aten op's outputs; each new storage is counted when it appears and
uncounted by a weakref finaliser when it dies, so views and in-place results are counted once.
Under ``FakeTensorMode`` the same accounting gives the real run's peak without allocating.
Storages that exist before tracking starts (parameters, optimizer state, inputs) are the
caller's to count; ``exclude`` keeps in-place updates of them from looking like new memory.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


def storage_key(tensor: torch.Tensor) -> int:
    """An identity for the tensor's storage, shared by all its views."""
    return tensor.untyped_storage()._cdata


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen: dict[int, int] = {}
    for t in tensors:
        seen[storage_key(t)] = t.untyped_storage().nbytes()
    return sum(seen.values())


@dataclass
class Phase:
    """A labelled stretch of the step: live bytes at its start and the peak within it."""

    label: str
    start: int
    peak: int


class LiveStorageTracker(TorchDispatchMode):
    """Tracks live bytes of storages created while active, with labelled phases."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.phases: list[Phase] = []
        self.allocated_in: dict[int, int] = {}
        """Storage key -> index of the phase that created it (to attribute saved tensors)."""
        self._sizes: dict[int, int] = {}
        self._known = {storage_key(t) for t in exclude}

    def mark(self, label: str) -> None:
        """Start a new phase now."""
        self.phases.append(Phase(label, self.live, self.live))

    def size_of(self, key: int) -> int:
        return self._sizes.get(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._track(leaf)
        return out

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._sizes or key in self._known:
            return
        size = storage.nbytes()
        self._sizes[key] = size
        self.allocated_in[key] = len(self.phases) - 1
        self.live += size
        self.peak = max(self.peak, self.live)
        if self.phases and self.live > self.phases[-1].peak:
            self.phases[-1].peak = self.live
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)
