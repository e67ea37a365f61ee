"""Per-rank budgets for data-parallel training: FSDP2 (``fully_shard``) and DDP.

A Profile describes one unwrapped training step on one device, with the per-rank batch. Under
data parallelism each rank runs that step with other memory beside it; ``per_rank`` turns the
profile into the profile of one rank, so every solver, prediction and plan is per rank.

FSDP2, ``world_size`` N, each block ``fully_shard``-ed and then the root (the documented
layout): parameters, gradients and optimizer state are sharded N ways (rounded up, plus
FSDP's small per-group bookkeeping tensors). On top of that each rank holds a working set of
unsharded parameters, measured on FSDP2 (torch 2.13, gloo) and modelled with ``p``, the largest
block's parameter bytes, and ``R``, the parameters outside the blocks:

- the root group stays unsharded through forward and backward (``R``; ``2R`` while it is
  gathered), and the root's gradients stay unsharded until the end of backward;
- a block's forward holds its unsharded parameters and its all-gather buffer (``2p``); its
  peak gains ``2p`` more, the next block's all-gather at its end or, when the block is
  recomputed in backward, its own re-gather; run checkpointed (no grad), ``p`` more;
- a block's backward holds its parameters, the next one's prefetched and the previous one's
  reduce-scatter buffer (``3p``); gradients of finished blocks are sharded.

DDP: parameters, gradients and optimizer state are replicated; the reducer allocates its
gradient buckets (one flat copy of every gradient, however they are split into 25 MB buckets)
when the model is wrapped and keeps them, so every figure gains the gradient bytes.

``RankMemory`` measures the live bytes of one rank on CPU with the same accounting as the
profiler (storages, counted once), made to see what data parallelism allocates.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from types import TracebackType

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ckptplan.errors import CkptplanError, option
from ckptplan.patching import patched
from ckptplan.profiling.memtrack import LiveStorageTracker, storage_key
from ckptplan.values.peak_event import PeakEvent
from ckptplan.values.phase import Direction, Phase
from ckptplan.values.profile_types import BlockProfile, Gap, Profile

MODES = ("fsdp", "ddp")
FSDP_GROUP_BYTES = 64
"""Bookkeeping per ``fully_shard`` group (mesh and padding tensors; ~30 B measured on CPU)."""


def _shifted(gap: Gap | None, forward: int, backward: int) -> Gap | None:
    """The gap's peaks with a rank's extra bytes in forward and in backward."""
    if gap is None:
        return None
    bwd_peak = None if gap.bwd_peak is None else gap.bwd_peak + backward
    return replace(gap, fwd_peak=gap.fwd_peak + forward, bwd_peak=bwd_peak)


def _plus(value: int | None, extra: int) -> int | None:
    return None if value is None else value + extra


def _ceil_div(x: int, n: int) -> int:
    return -(-x // n)


def per_rank(profile: Profile, world_size: int, mode: str) -> Profile:
    """The profile of one of ``world_size`` ranks training under ``mode`` ("fsdp" or "ddp")."""
    if mode not in MODES:
        raise CkptplanError(f"unknown parallel mode {mode!r}; choose one of {', '.join(MODES)}")
    if world_size < 1:
        raise CkptplanError(f"{option('world_size', world_size)}: it must be at least 1")
    if not profile.blocks:
        raise CkptplanError("the profile has no blocks; per-rank figures need the chain")
    rank = _FsdpRank(profile, world_size) if mode == "fsdp" else _DdpRank(profile)
    blocks = tuple(rank.block(i, b) for i, b in enumerate(profile.blocks))
    phases = tuple(
        (label, start + rank.at(label, "start"), peak + rank.at(label, "peak"))
        for label, start, peak in profile.phases
    )
    return replace(
        profile,
        blocks=blocks,
        parameter_bytes=rank.parameter_bytes,
        trainable_bytes=(
            None
            if profile.trainable_bytes is None
            else profile.trainable_bytes * rank.parameter_bytes // max(1, profile.parameter_bytes)
        ),
        optimizer_bytes=rank.optimizer_bytes,
        persistent_bytes=profile.persistent_bytes + rank.shift,
        peak_bytes=max(
            [peak for _, _, peak in phases]
            + [v for v, _ in rank.events(profile.tail_peaks + profile.fixed_peaks)]
        ),
        tail_peaks=rank.events(profile.tail_peaks),
        fixed_peaks=rank.events(profile.fixed_peaks),
        phases=phases,
        # A rank's gap figures are shifted at their peaks only; nested stages need their
        # starts too, so per-rank plans checkpoint blocks and runs of blocks.
        enclosures=(),
    )


class _DdpRank:
    """DDP: everything replicated, plus the reducer's buckets (a copy of every gradient)."""

    def __init__(self, profile: Profile) -> None:
        self.shift = profile.parameter_bytes
        self.parameter_bytes = profile.parameter_bytes
        self.optimizer_bytes = profile.optimizer_bytes

    def at(self, label: str, where: str) -> int:
        return self.shift

    def block(self, index: int, b: BlockProfile) -> BlockProfile:
        return replace(
            b,
            fwd_start=b.fwd_start + self.shift,
            fwd_peak=b.fwd_peak + self.shift,
            replay_peak=_plus(b.replay_peak, self.shift),
            bwd_start=b.bwd_start + self.shift,
            bwd_peak=b.bwd_peak + self.shift,
            gap=_shifted(b.gap, self.shift, self.shift),
        )

    def events(self, events: tuple[tuple[int, str], ...]) -> tuple[tuple[int, str], ...]:
        return tuple((v + self.shift, e) for v, e in events)


class _FsdpRank:
    """FSDP2 with every block and the root ``fully_shard``-ed (see the module docstring)."""

    def __init__(self, profile: Profile, world_size: int) -> None:
        n = world_size
        self.blocks = profile.blocks
        self.p = max(b.parameter_bytes for b in profile.blocks)
        block_params = sum(b.parameter_bytes for b in profile.blocks)
        self.root = max(0, profile.parameter_bytes - block_params)
        self.parameter_bytes = _ceil_div(profile.parameter_bytes, n)
        self.optimizer_bytes = _ceil_div(profile.optimizer_bytes, n)
        overhead = FSDP_GROUP_BYTES * (len(profile.blocks) + 1)
        self.shift = (
            self.parameter_bytes
            + self.optimizer_bytes
            + overhead
            - profile.parameter_bytes
            - profile.optimizer_bytes
        )
        later = [
            sum(b.parameter_bytes for b in profile.blocks[i + 1 :]) for i in range(len(self.blocks))
        ]
        self.sharded_later = [x - _ceil_div(x, n) for x in later]
        """Gradient bytes saved in block i's backward: the later blocks' gradients are shards."""
        self.sharded_blocks = block_params - _ceil_div(block_params, n)
        self.sharded_all = profile.parameter_bytes - self.parameter_bytes
        self.forward_set = self.root + 2 * self.p
        self.backward_set = self.root + 3 * self.p

    def block(self, index: int, b: BlockProfile) -> BlockProfile:
        saved = self.sharded_later[index]
        return replace(
            b,
            fwd_start=b.fwd_start + self.shift + self.forward_set,
            fwd_peak=b.fwd_peak + self.shift + self.forward_set + 2 * self.p,
            replay_peak=_plus(b.replay_peak, self.shift + self.forward_set + 2 * self.p),
            fwd_peak_nograd=b.fwd_peak_nograd + self.p,
            bwd_start=b.bwd_start + self.shift + self.backward_set - saved,
            bwd_peak=b.bwd_peak + self.shift + self.backward_set - saved,
            grads_at_bwd_end=b.grads_at_bwd_end - saved,
            grads_at_bwd_start=max(0, b.grads_at_bwd_start - saved),
            grads_at_bwd_peak=max(0, b.grads_at_bwd_peak - saved),
            gap=_shifted(
                b.gap,
                self.shift + self.forward_set + 2 * self.p,
                self.shift + self.backward_set - saved,
            ),
        )

    def at(self, label: str, where: str) -> int:
        """The change of a phase's live bytes (at its start or its peak)."""
        phase = Phase.parse(label)
        if phase.index is not None:  # a block, or the code after it
            if phase.is_forward:
                extra = 2 * self.p if where == "peak" else 0
                return self.shift + self.forward_set + extra
            return self.shift + self.backward_set - self.sharded_later[phase.index]
        return self.shift + self._outside(phase)

    def _outside(self, phase: Phase | None) -> int:
        """Working set and gradient sharding at the phases outside the blocks."""
        if phase == Phase.pre(Direction.FORWARD):
            return 2 * self.root
        if phase == Phase.post(Direction.FORWARD):
            return self.root + 2 * self.p
        if phase == Phase.post(Direction.BACKWARD):
            return self.backward_set
        if phase == Phase.pre(Direction.BACKWARD):
            return self.backward_set - self.sharded_blocks
        if phase == Phase.optimizer():
            return self.root - self.sharded_all
        return -self.sharded_all

    def events(self, events: tuple[tuple[int, str], ...]) -> tuple[tuple[int, str], ...]:
        """The events outside the blocks, each shifted as the phase it peaks in."""
        return tuple(
            (v + self.shift + self._outside(PeakEvent.parse(e).phase), e) for v, e in events
        )


class RankMemory(LiveStorageTracker):
    """Live bytes of this rank (CPU): enter it before the model is built, so everything counts.

    The profiler's accounting (storages counted once, freed with their last reference), with
    what data parallelism adds: DTensor shards are counted by their local tensors, and FSDP2's
    unsharded parameters, whose storage it resizes in place, are followed through its
    ``alloc_storage``/``free_storage``. Frees are seen on any thread, so buffers that a
    collective's worker thread releases are not counted twice (torch.profiler misses those).
    """

    def __init__(self) -> None:
        super().__init__()
        self._patches: contextlib.ExitStack | None = None

    def __enter__(self) -> RankMemory:
        self._patches = contextlib.ExitStack()
        self._patches.enter_context(_fsdp_storage_hooks(self._resized))
        super().__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        super().__exit__(kind, value, traceback)
        if self._patches is not None:
            self._patches.close()

    def phase_peak(self, label: str) -> int:
        """The peak live bytes of the phase started by ``mark(label)``."""
        for phase in self.phases:
            if phase.label == label:
                return phase.peak
        raise KeyError(label)

    def _track(self, tensor: torch.Tensor, raise_peak: bool = True) -> None:
        if is_traceable_wrapper_subclass(tensor):
            names, _ = tensor.__tensor_flatten__()
            for name in names:
                inner = getattr(tensor, name)
                if isinstance(inner, torch.Tensor):
                    self._track(inner, raise_peak)
            return
        super()._track(tensor, raise_peak)

    def _resized(self, tensor: torch.Tensor) -> None:
        key = storage_key(tensor)
        if key not in self._sizes:
            self._track(tensor)
            return
        size = tensor.untyped_storage().nbytes()
        self.live += size - self._sizes[key]
        self._sizes[key] = size
        self.peak = max(self.peak, self.live)
        if self.phases and self.live > self.phases[-1].peak:
            self.phases[-1].peak = self.live


@contextlib.contextmanager
def _fsdp_storage_hooks(resized: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """Call ``resized`` after FSDP2 grows or frees a storage in place (no dispatcher op, so
    a process-wide patch of its module functions, under ``patching``'s lock: Note
    [process-wide patches])."""
    if not torch.distributed.is_available():
        yield
        return
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    modules = [m for m in (_fsdp_param, _fsdp_param_group) if hasattr(m, "alloc_storage")]
    originals = [(m, m.alloc_storage, getattr(m, "free_storage", None)) for m in modules]

    def wrap(function: Callable[[torch.Tensor], None]) -> Callable[[torch.Tensor], None]:
        def resize(tensor: torch.Tensor) -> None:
            function(tensor)
            resized(tensor)

        return resize

    with contextlib.ExitStack() as patches:
        for module, alloc, free in originals:
            patches.enter_context(patched(module, "alloc_storage", wrap(alloc)))
            if free is not None:
                patches.enter_context(patched(module, "free_storage", wrap(free)))
        yield
