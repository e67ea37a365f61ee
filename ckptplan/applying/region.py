"""One checkpointed region at run time: its members run in order inside one non-reentrant
checkpoint, nested regions as checkpoints of their own, under the region's selective policy.

A region is entered from its first member's call and returns that member's output; each later
member hands back the output computed for it, after checking it received the output of the
member before it (which the profiler checked before the solver was allowed to join them).
Recomputation puts back the buffers the forward mutated (BatchNorm statistics), and runs under
the GPU attention emulation when the forward did.

Note [knowing a recomputation]
    A region learns that it recomputes from checkpoint's own ``context_fn``: the recompute
    context it returns (``Replaying``) is entered around each recomputation, before the
    selective policy's dispatch modes, so it can copy the buffers to restore while those modes
    do not yet run (their recompute side refuses an op the forward did not run). Nested regions
    (a run of the enclosing region's members, or modules inside them) share one count of the
    recomputations running (``Replays``): a nested region that runs inside its enclosing
    region's recomputation is recomputed too, and is counted so. Under
    ``torch.compile`` no such context is passed (the compiler takes only selective-checkpoint
    contexts): the partitioner decides what recomputes, and nothing is counted.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from ckptplan.applying.gpukernels import GPU_ONLY_OPS, GpuAttention, emulated, runs_gpu_kernels
from ckptplan.applying.guards import refuse_second_checkpointing
from ckptplan.applying.hublayers import resolve_hub_layers
from ckptplan.applying.policy import OpCalls, op_overload, selective_contexts
from ckptplan.applying.stats import RegionStats, Reporter, region_name
from ckptplan.applying.tensors import first_tensor
from ckptplan.errors import CkptplanError, option
from ckptplan.huggingface import checkpointing_layers
from ckptplan.values.policy_types import OpCall, Policy


@dataclass
class Replays:
    """How many recomputations of a tree of nested regions are running (Note [knowing a
    recomputation])."""

    running: int = 0


class Replaying:
    """A region's recompute context: counts the recomputation, keeps the buffers its forward
    mutated and puts them back after it, around the policy's own recompute context ``inner``.
    A class, not a generator, because a second backward (``retain_graph``) enters it again."""

    def __init__(self, region: RegionRun, inner: AbstractContextManager[Any]) -> None:
        self.region = region
        self.inner = inner
        self.kept: list[torch.Tensor] = []

    def __enter__(self) -> None:
        self.region.replays.running += 1
        with torch.no_grad():
            self.kept = [b.clone() for b in self.region.stateful]
        self.inner.__enter__()

    def __exit__(self, *exc: Any) -> bool | None:
        try:
            return self.inner.__exit__(*exc)
        finally:
            # Through ``.data``, which has a version counter of its own: a BatchNorm's forward
            # saves its running statistics for backward, and a shared module's other calls
            # (unchecked, or recomputed later) must find them at the version they saved.
            with torch.no_grad():
                for buffer, value in zip(self.region.stateful, self.kept, strict=True):
                    buffer.data.copy_(value)
            self.kept = []
            self.region.replays.running -= 1


def _replayed(region: RegionRun, contexts: Callable[[], tuple[Any, Any]] | None) -> tuple[Any, Any]:
    """The ``context_fn`` of an eager region: its policy's contexts (none for a plain
    checkpoint), the recompute one inside ``Replaying``."""
    forward, recompute = contexts() if contexts else (nullcontext(), nullcontext())
    return forward, Replaying(region, recompute)


class RegionRun:
    """One checkpointed region: its members, nested sub-runs, policy and counters."""

    def __init__(
        self,
        modules: list[torch.nn.Module],
        paths: tuple[str, ...],
        bases: list[type[torch.nn.Module]],
        policy: Policy | None,
        stats: RegionStats,
        reporter: Reporter | None,
    ) -> None:
        self.modules = modules
        self.paths = paths
        self.bases = bases
        self.name = region_name(paths)
        self.policy = None if policy is None else _op_calls(policy, self.name)
        """The policy's saved and offloaded op calls as the runtime takes them (None: plain
        checkpoint)."""
        named = () if policy is None else (*policy.saves, *policy.offloads)
        self.gpu_only = sorted({call.op for call in named} & GPU_ONLY_OPS)
        """Ops the policy names that only a CUDA device runs (a plan made for a GPU)."""
        self.emulating = False
        """The forward ran under ``GpuAttention`` (a fake run for a GPU): so does recompute."""
        self.stats = stats
        self.reporter = reporter
        self.hf_layers = checkpointing_layers(modules)
        """Layers Hugging Face's checkpointing can switch on (refused once planned)."""
        resolve_hub_layers(modules)
        self.steps: list[tuple[int, int, RegionRun | None]] = [
            (i, i + 1, None) for i in range(len(modules))
        ]
        self.stateful: list[torch.Tensor] = []
        """Buffers the forward mutates (BatchNorm statistics): restored after recomputation."""
        self.replays = Replays()
        """Shared by every region of one nest (Note [knowing a recomputation])."""
        self.inside: list[RegionRun] = []
        """Nested regions of modules inside the members, called from those modules."""
        self.pending: list[Any] = []
        self.expected: torch.Tensor | None = None

    def nest(self, start: int, end: int, child: RegionRun) -> None:
        """Run members ``[start, end)`` as their own checkpoint inside this one."""
        steps = [s for s in self.steps if not start <= s[0] < end]
        steps.append((start, end, child))
        self.steps = sorted(steps, key=lambda s: s[0])
        child.share(self.replays)

    def enclose(self, child: RegionRun) -> None:
        """``child`` checkpoints modules inside this region's members, entered from their own
        calls: it recomputes whenever this region does."""
        self.inside.append(child)
        child.share(self.replays)

    def share(self, replays: Replays) -> None:
        """Count this region's and its nested regions' recomputations in ``replays``."""
        self.replays = replays
        for child in [c for _, _, c in self.steps if c is not None] + self.inside:
            child.share(replays)

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """The checkpointed function: every member in order, through its original call."""
        if torch.compiler.is_compiling() or not self.replays.running:
            return self._members(args, kwargs)
        self.stats.recomputes += 1
        with GpuAttention() if self.emulating else nullcontext():
            return self._members(args, kwargs)

    def _members(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        outs: list[Any] = []
        for start, _, child in self.steps:
            if outs:
                args, kwargs = _next_arguments(args, kwargs, first_tensor(outs[-1]))
            if child is None:
                outs.append(self.bases[start].__call__(self.modules[start], *args, **kwargs))
            else:
                outs.extend(child.checkpointed(args, kwargs))
        return tuple(outs)

    def checkpointed(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """The members' outputs, computed under this region's checkpoint."""
        if not torch.is_grad_enabled():
            return self._members(args, kwargs)
        if torch.compiler.is_compiling():
            return self._checkpoint(args, kwargs)
        if self.reporter is not None:
            self.reporter.before_forward()
        self.stats.forwards += 1
        refuse_second_checkpointing(self.name, self.hf_layers)
        self.emulating = emulated()
        self._check_device(args, kwargs)
        norms, others = self._buffers()
        versions = [b._version for b in others]
        outs = self._checkpoint(args, kwargs)
        changed = [b for b, v in zip(others, versions, strict=True) if b._version != v]
        self.stateful = norms + changed
        if self.reporter is not None:
            self.reporter.watch((args, kwargs), self.modules)
        return outs

    def _spread(self, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        return self.run(args, kwargs)

    def _check_device(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = first_tensor((args, kwargs))
        if self.gpu_only and x is not None and not runs_gpu_kernels(x):
            raise CkptplanError(
                f"the plan was made for a GPU: region {self.name} keeps {self.gpu_only[0]}, "
                f"which {x.device.type} never runs; solve again with "
                f"{option('target', x.device.type)}"
            )

    def _checkpoint(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        # The region's tensor arguments go to checkpoint one by one, so it saves them as saved
        # tensors (a tuple would be held as is): under an enclosing checkpoint, they are then
        # dropped through forward like everything else the enclosing region saves.
        compiling = torch.compiler.is_compiling()
        contexts = None
        if self.policy is not None:
            saves, offloads = self.policy
            # Built here, not stored: torch.compile takes a context_fn made in the traced
            # frame. Eager torch recomputes what a *_CPU_OFFLOAD policy names, so eager offload
            # runs ckptplan's own caching modes; under torch.compile the partitioner does.
            policy = _eager_offload() if offloads and not compiling else selective_contexts
            contexts = functools.partial(policy, saves, offloads)
        if not compiling:
            contexts = functools.partial(_replayed, self, contexts)
        extra = {} if contexts is None else {"context_fn": contexts}
        return checkpoint(
            self._spread, *args, use_reentrant=False, preserve_rng_state=True, **extra, **kwargs
        )

    def _buffers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Running statistics of training norm layers (updated in place without a version bump
        on CPU), and the other buffers, whose version counters show a mutation."""
        norms: dict[int, torch.Tensor] = {}
        others: dict[int, torch.Tensor] = {}
        for member in self.modules:
            for module in member.modules():
                # BatchNorm's and InstanceNorm's flag, read by name: their base class is private.
                tracked = module.training and getattr(module, "track_running_stats", False) is True
                for buffer in module.buffers(recurse=False):
                    (norms if tracked else others).setdefault(id(buffer), buffer)
        return list(norms.values()), [b for k, b in others.items() if k not in norms]

    def call(self, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A member's ``__call__`` from outside the region."""
        if index == 0:
            outs = self.checkpointed(args, kwargs)
            self.pending = list(outs[1:])
            self.expected = first_tensor(outs[0]) if self.pending else None
            return outs[0]
        if len(self.pending) != len(self.modules) - index:
            self.pending = []
            raise RuntimeError(
                f"ckptplan: {self.paths[index]} ran without {self.paths[index - 1]} just before "
                "it, but the plan checkpoints them as one region; re-solve with "
                f"{option('max_segment', 1)}"
            )
        received = first_tensor(args) if args else first_tensor(kwargs)
        if received is not self.expected:
            self.pending = []
            raise RuntimeError(
                f"ckptplan: {self.paths[index]} did not receive the output of "
                f"{self.paths[index - 1]}, so they cannot share a checkpoint region; re-solve "
                f"with {option('max_segment', 1)}"
            )
        out = self.pending.pop(0)
        self.expected = first_tensor(out) if self.pending else None
        return out


def _eager_offload() -> Callable[[OpCalls, OpCalls], tuple[Any, Any]]:
    """The contexts of a region that offloads in eager mode, imported at its first call: their
    module is the one in the runtime that names a private torch API (``TorchDispatchMode``),
    so only a plan that offloads in eager mode loads it."""
    from ckptplan.applying.offload import offload_contexts

    return offload_contexts


def _next_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any], x: torch.Tensor | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The next member's arguments: the previous output in place of the first tensor input.

    A new dict, never the caller's: checkpoint keeps the region's arguments for recomputation.
    """
    if args:
        return (x, *args[1:]), kwargs
    first = next(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
    return (), {**kwargs, first: x}


def _op_calls(policy: Policy, region: str) -> tuple[OpCalls, OpCalls]:
    """The policy's saved and offloaded op calls as the runtime takes them, each op checked to
    be a torch op here (a plan names ops by their names only)."""

    def resolved(calls: tuple[OpCall, ...]) -> OpCalls:
        for call in calls:
            try:
                op_overload(call.op)
            except AttributeError:
                raise CkptplanError(
                    f"policy of {region} names {call.op!r}, which is no torch op"
                ) from None
        return tuple((call.op, call.index) for call in calls)

    return resolved(policy.saves), resolved(policy.offloads)
