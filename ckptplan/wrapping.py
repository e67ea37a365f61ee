"""Apply a plan to a model in place, with non-reentrant ``torch.utils.checkpoint``.

Every planned module keeps its path, parameters and ``state_dict`` keys; only its class is
swapped for a subclass of the same name whose ``__call__`` routes the call through its region.
A region (one module, or a run of consecutive sibling blocks) runs all its members inside one
checkpoint from the first member's call, each member through its original ``__call__``, so
module hooks (FSDP2's all-gather and reshard, Hugging Face's, the user's) run inside the
region, again during recomputation, and once per forward. The first member's call returns its
own output and each later member hands back the output computed for it, after checking it
received the output of the member before it (which the profiler checked before the solver was
allowed to join them).

Nothing on the checkpointed path mutates Python state while ``torch.compile`` traces it (no
counter either: dynamo guards on what it reads, and a counter read in the trace would recompile
the model at every step), so a checkpointed model compiles once, without graph breaks; in eager
mode each region counts its
recomputations, and the first backward logs how many regions were recomputed (and warns about
any that ran forward but never recomputed), so a plan cannot be silently not applied.

Running order: ``apply`` first, then ``fully_shard``/``DistributedDataParallel``, then
``torch.compile``.

Example:
    >>> model = ckptplan.apply(model, "plan.json")   # doctest: +SKIP
    >>> print(model.ckptplan_applied)                 # doctest: +SKIP
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_map_only
from torch.utils.checkpoint import (
    SAC_IGNORED_OPS,
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from ckptplan.errors import CkptplanError, option
from ckptplan.fingerprint import check_model_matches
from ckptplan.gpukernels import GPU_ONLY_OPS, GpuAttention, emulated, runs_gpu_kernels
from ckptplan.guards import BatchGuard, hf_checkpointing_layers, refuse_second_checkpointing
from ckptplan.plan import Plan, Region, as_plan
from ckptplan.training import first_tensor, training_conventions

log = logging.getLogger("ckptplan")

_POLICY_KEYS = ("save", "offload")


@dataclass
class RegionStats:
    """Counters of one region: forward calls that build a graph, and recomputations."""

    name: str
    forwards: int = 0
    recomputes: int = 0


@dataclass
class AppliedPlan:
    """What ``apply`` did (regions and policies), and what the regions have done since."""

    regions: tuple[tuple[str, ...], ...]
    solver: str
    policies: tuple[dict[str, Any] | None, ...] = ()
    nested: tuple[tuple[str, ...], ...] = ()
    stats: tuple[RegionStats, ...] = field(default=(), repr=False, compare=False)
    """Counters of the top-level regions, in plan order."""
    nested_stats: tuple[RegionStats, ...] = field(default=(), repr=False, compare=False)
    first_backward: str | None = None
    """The report logged at the end of the first backward that reached a region."""

    @property
    def recomputed(self) -> int:
        """Recomputations of top-level regions so far (eager mode)."""
        return sum(s.recomputes for s in self.stats)

    def __str__(self) -> str:
        names = ", ".join(_region_name(r) for r in self.regions)
        text = f"ckptplan: checkpointed {len(self.regions)} regions ({self.solver}): {names}"
        selective = [
            f"{_region_name(r)} keeps {_count(len(p['save']), 'op output')}"
            for r, p in zip(self.regions, self.policies, strict=True)
            if p
        ]
        if selective:
            text += "; selective: " + "; ".join(selective)
        if self.nested:
            text += "; nested: " + ", ".join(_region_name(r) for r in self.nested)
        return text


def _region_name(modules: tuple[str, ...]) -> str:
    return "+".join(modules)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


class _Reporter:
    """Logs, once, how many regions the first backward recomputed (eager mode)."""

    def __init__(self, applied: AppliedPlan) -> None:
        self.applied = applied
        self.queued = False
        self.done = False

    def watch(self, out: Any) -> None:
        """Hook the region's output so the end of the backward through it is seen."""
        if self.done:
            return
        leaf = first_tensor(out)
        if leaf is not None and leaf.requires_grad:
            leaf.register_hook(self._on_gradient)

    def _on_gradient(self, grad: torch.Tensor) -> None:
        if not self.queued and not self.done:
            self.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._report)

    def _report(self) -> None:
        self.done = True
        stats = self.applied.stats
        ran = [s for s in stats if s.forwards > 0]
        missed = [s.name for s in ran if s.recomputes == 0]
        text = (
            f"ckptplan: the first backward recomputed {len(ran) - len(missed)} of {len(ran)} "
            f"checkpointed regions that ran forward ({len(stats)} planned)"
        )
        self.applied.first_backward = text
        if missed:
            log.warning(
                "%s; never recomputed: %s (their saved tensors were not needed)",
                text,
                ", ".join(missed),
            )
        else:
            log.info("%s", text)


class _RegionRun:
    """One checkpointed region: its members, nested sub-runs, policy and counters."""

    def __init__(
        self,
        modules: list[torch.nn.Module],
        paths: tuple[str, ...],
        bases: list[type[torch.nn.Module]],
        policy: dict[str, Any] | None,
        stats: RegionStats,
        reporter: _Reporter | None,
    ) -> None:
        self.modules = modules
        self.paths = paths
        self.bases = bases
        self.name = _region_name(paths)
        self.policy = _policy_ops(policy, self.name)
        self.gpu_only = sorted(
            {e.partition("#")[0] for e in sum(self.policy or ((), ()), ())} & GPU_ONLY_OPS
        )
        """Ops the policy names that only a CUDA device runs (a plan made for a GPU)."""
        self.emulating = False
        """The forward ran under ``GpuAttention`` (a fake run for a GPU): so does recompute."""
        self.stats = stats
        self.reporter = reporter
        self.hf_layers = hf_checkpointing_layers(modules)
        """Layers Hugging Face's checkpointing can switch on (refused once planned)."""
        self.steps: list[tuple[int, int, _RegionRun | None]] = [
            (i, i + 1, None) for i in range(len(modules))
        ]
        self.stateful: list[torch.Tensor] = []
        """Buffers the forward mutates (BatchNorm statistics): restored after recomputation."""
        self.pending: list[Any] = []
        self.expected: torch.Tensor | None = None

    def nest(self, start: int, end: int, child: _RegionRun) -> None:
        """Run members ``[start, end)`` as their own checkpoint inside this one."""
        steps = [s for s in self.steps if not start <= s[0] < end]
        steps.append((start, end, child))
        self.steps = sorted(steps, key=lambda s: s[0])

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """The checkpointed function: every member in order, through its original call."""
        if not torch.compiler.is_compiling() and torch._C._current_graph_task_id() != -1:
            self.stats.recomputes += 1
            return self._recompute(args, kwargs)
        return self._members(args, kwargs)

    def _recompute(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """Re-run forward, keeping buffers (BatchNorm statistics) as the forward left them."""
        # Outside the dispatch modes of selective checkpointing, whose recompute side refuses
        # an op its forward did not run.
        with torch.no_grad(), _disable_current_modes():
            kept = [b.clone() for b in self.stateful]
        try:
            with GpuAttention() if self.emulating else nullcontext():
                return self._members(args, kwargs)
        finally:
            with torch.no_grad(), _disable_current_modes():
                for buffer, value in zip(self.stateful, kept, strict=True):
                    buffer.copy_(value)

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
            self.reporter.watch(outs[-1])
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
        if self.policy is None:
            return checkpoint(
                self._spread, *args, use_reentrant=False, preserve_rng_state=True, **kwargs
            )
        saves, offloads = self.policy
        # Built here, not stored: torch.compile takes a context_fn made in the traced frame.
        # Eager torch recomputes what a *_CPU_OFFLOAD policy names, so eager offload runs
        # ckptplan's own caching modes; under torch.compile the policy goes to the partitioner.
        contexts = (
            _offload_contexts
            if offloads and not torch.compiler.is_compiling()
            else _selective_contexts
        )
        return checkpoint(
            self._spread,
            *args,
            use_reentrant=False,
            preserve_rng_state=True,
            context_fn=functools.partial(contexts, saves, self.name, offloads),
            **kwargs,
        )

    def _buffers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Running statistics of training norm layers (updated in place without a version bump
        on CPU), and the other buffers, whose version counters show a mutation."""
        norms: dict[int, torch.Tensor] = {}
        others: dict[int, torch.Tensor] = {}
        for member in self.modules:
            for module in member.modules():
                tracked = isinstance(module, torch.nn.modules.batchnorm._NormBase) and (
                    module.training and module.track_running_stats
                )
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


def _resolve_op(name: str, region: str) -> torch._ops.OpOverload:
    parts = name.split(".")
    if len(parts) != 3:
        raise CkptplanError(
            f"policy of {region} names {name!r}; name ops as namespace.op.overload, "
            "e.g. aten.mm.default"
        )
    try:
        return getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
    except AttributeError:
        raise CkptplanError(f"policy of {region} names {name!r}, which is no torch op") from None


@functools.cache
def _saved_ops(saves: tuple[str, ...], region: str) -> tuple[frozenset[Any], frozenset[Any]]:
    """Ops saved at every call, and (op, k) pairs saved at their k-th call."""
    every: set[Any] = set()
    nth: set[tuple[Any, int]] = set()
    for entry in saves:
        name, _, index = entry.partition("#")
        op = _resolve_op(name, region)
        if not index:
            every.add(op)
        elif index.isdigit():
            nth.add((op, int(index)))
        else:
            raise CkptplanError(f"policy of {region} names {entry!r}; write op#k, k >= 0")
    return frozenset(every), frozenset(nth)


class _Choices:
    """What a region's policy does with each op call: ``"save"``, ``"offload"`` or None
    (recompute). Calls are counted per overload, separately in forward and recompute."""

    def __init__(self, saves: tuple[str, ...], offloads: tuple[str, ...], region: str) -> None:
        self.kept = _saved_ops(saves, region)
        self.moved = _saved_ops(offloads, region)
        self.counts: dict[bool, Counter[Any]] = {False: Counter(), True: Counter()}

    def __call__(self, func: Any, recompute: bool) -> tuple[str | None, int]:
        seen = self.counts[recompute]
        index = seen[func]
        seen[func] += 1
        for choice, (every, nth) in (("save", self.kept), ("offload", self.moved)):
            if func in every or (func, index) in nth:
                return choice, index
        return None, index


def _selective_contexts(
    saves: tuple[str, ...], region: str, offloads: tuple[str, ...] = ()
) -> tuple[Any, Any]:
    """The selective-checkpoint contexts of one region call (op counts start at 0 in each).

    A plain function under ``functools.partial``, the ``context_fn`` form that both pickling and
    ``torch.compile`` accept.
    """
    choices = _Choices(saves, offloads, region)
    policies = {
        "save": CheckpointPolicy.MUST_SAVE,
        "offload": CheckpointPolicy.MUST_CPU_OFFLOAD,
        None: CheckpointPolicy.PREFER_RECOMPUTE,
    }

    def decide(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        choice = choices(func, ctx.is_recompute)[0]
        if choice is None and _random(func) and torch.compiler.is_compiling():
            return CheckpointPolicy.MUST_SAVE  # see Note [random ops under torch.compile]
        return policies[choice]

    return create_selective_checkpoint_contexts(decide)


# Note [random ops under torch.compile]
#     In eager mode a selective region's recomputation replays the RNG state checkpoint saved,
#     so a recomputed dropout draws its forward's mask again. Under torch.compile a region with
#     a policy is traced once, and the partitioner recomputes a PREFER_RECOMPUTE random op in
#     the backward graph with fresh numbers: gradients that are wrong (relative error 0.07 on
#     the test's MLP with dropout), the same fault as compile's own memory budget. So under
#     compile a policy keeps every random op's outputs; the fake run, which compiles the plan,
#     counts what they hold.


def _random(func: Any) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())


@dataclass(frozen=True)
class _Offloaded:
    """A saved output moved off the device: a pinned host copy, or a fake tensor's layout."""

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
    """Move ``t`` off its device. On a CPU it is host memory already and stays; a fake tensor
    keeps only its layout, so a fake run counts no device bytes for it until it returns."""
    if isinstance(t, FakeTensor):
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

    def __init__(self, choices: _Choices, cache: dict[tuple[Any, int], Any]) -> None:
        super().__init__()
        self.choices = choices
        self.cache = cache

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in SAC_IGNORED_OPS:
            return out
        choice, index = self.choices(func, recompute=False)
        if choice == "save":
            self.cache[func, index] = tree_map_only(torch.Tensor, _keep, out)
        elif choice == "offload":
            self.cache[func, index] = tree_map_only(torch.Tensor, _to_host, out)
        return out


class _OffloadingRecompute(TorchDispatchMode):
    """Recompute of such a region: kept and offloaded outputs come back, the rest runs again."""

    def __init__(self, choices: _Choices, cache: dict[tuple[Any, int], Any]) -> None:
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


def _offload_contexts(
    saves: tuple[str, ...], region: str, offloads: tuple[str, ...]
) -> tuple[Any, Any]:
    """Eager contexts of a region whose policy offloads: one cache shared by forward and
    recompute, so the outputs it holds are not computed again."""
    choices = _Choices(saves, offloads, region)
    cache: dict[tuple[Any, int], Any] = {}
    return _OffloadingForward(choices, cache), _OffloadingRecompute(choices, cache)


def _policy_ops(
    policy: dict[str, Any] | None, region: str
) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The ops a policy ``{"save": [...], "offload": [...]}`` keeps and sends to host memory
    (None without a policy).

    An entry ``op#k`` names the k-th call of ``op`` in the region (counting from 0), a bare
    ``op`` every call; every other op is recomputed.
    """
    if not policy:
        return None
    unknown = sorted(set(policy) - set(_POLICY_KEYS))
    if unknown:
        raise CkptplanError(
            f"policy of {region} has {', '.join(map(repr, unknown))}; apply supports "
            f"{', '.join(_POLICY_KEYS)}"
        )
    saves = tuple(str(e) for e in policy.get("save", ()))
    offloads = tuple(str(e) for e in policy.get("offload", ()))
    _saved_ops(saves, region)
    _saved_ops(offloads, region)
    both = set(saves) & set(offloads)
    if both:
        raise CkptplanError(
            f"policy of {region} both saves and offloads {sorted(both)[0]}; name it once"
        )
    return saves, offloads


def _policy_saves(policy: dict[str, Any] | None, region: str) -> tuple[str, ...] | None:
    """The ops a policy keeps, for code that cannot offload (the rewriter)."""
    ops = _policy_ops(policy, region)
    if ops is None:
        return None
    saves, offloads = ops
    if offloads:
        raise CkptplanError(
            f"policy of {region} offloads ops, which `ckptplan rewrite` does not do; apply the "
            "plan with ckptplan.apply(model, plan) instead"
        )
    return saves


def _member_call(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    region, index = self.__dict__["_ckptplan_member"]
    return region.call(index, args, kwargs)


def _member_reduce(self: torch.nn.Module, protocol: int) -> tuple[Any, ...]:
    """Pickle (and deepcopy) a member as its class's member variant, by the original class."""
    return (_new_member, (type(self)._ckptplan_base,), self.__dict__.copy())


def _new_member(base: type[torch.nn.Module]) -> torch.nn.Module:
    return object.__new__(_member_class(base))


_MEMBER_CLASSES: dict[type[torch.nn.Module], type[torch.nn.Module]] = {}


def _member_class(base: type[torch.nn.Module]) -> type[torch.nn.Module]:
    """``base`` with a region-routing ``__call__``; same name, so fingerprints are unchanged."""
    if base not in _MEMBER_CLASSES:
        _MEMBER_CLASSES[base] = type(
            base.__name__,
            (base,),
            {
                "__call__": _member_call,
                "__reduce_ex__": _member_reduce,
                "__module__": base.__module__,
                "__qualname__": base.__qualname__,
                "_ckptplan_base": base,
            },
        )
    return _MEMBER_CLASSES[base]


def _refuse_wrapped(model: torch.nn.Module) -> None:
    """One-line errors for the orders that cannot work, with the order that does."""
    order = "ckptplan.apply(model, plan), then fully_shard/DDP, then torch.compile"
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise CkptplanError(f"apply the plan before wrapping the model in DDP: {order}")
    if type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod"):
        raise CkptplanError(f"apply the plan before torch.compile: {order}")
    if torch.distributed.is_available():
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

        if any(isinstance(m, FSDPModule | FullyShardedDataParallel) for m in model.modules()):
            raise CkptplanError(f"apply the plan before fully_shard (FSDP): {order}")
    for module in model.modules():
        current = hasattr(type(module), "is_activation_checkpointing")
        flag = "is_activation_checkpointing" if current else "is_gradient_checkpointing"
        declared = hasattr(type(module), flag) or flag in vars(module)
        if declared and getattr(module, flag) is True:
            disable = "activation" if current else "gradient"
            raise CkptplanError(
                "the model already has Hugging Face checkpointing on, so the plan would "
                f"checkpoint twice; call model.{disable}_checkpointing_disable() before applying it"
            )


def _check_region(region: Region, modules: dict[str, torch.nn.Module], used: set[str]) -> None:
    if not region.modules:
        raise CkptplanError("the plan has a region with no modules; re-solve it")
    parents = {path.rpartition(".")[0] for path in region.modules}
    if len(parents) != 1:
        raise CkptplanError(
            f"region {_region_name(region.modules)} joins modules of different parents; a "
            "region is a run of sibling modules"
        )
    for path in region.modules:
        if path not in modules:
            raise CkptplanError(f"the plan names module {path!r}, which this model lacks")
        if "_ckptplan_member" in modules[path].__dict__:
            raise CkptplanError(f"{path} is already checkpointed by ckptplan; apply a plan once")
        if path in used:
            raise CkptplanError(f"{path} is in two regions of the plan; re-solve it")
        used.add(path)


class _Installer:
    """Builds the runtime regions of a plan and swaps the members' classes."""

    def __init__(self, model: torch.nn.Module, applied: AppliedPlan) -> None:
        self.modules = dict(model.named_modules())
        self.reporter = _Reporter(applied)
        self.stats: list[RegionStats] = []
        self.nested_stats: list[RegionStats] = []
        self.nested: list[tuple[str, ...]] = []
        self.used: set[str] = set()
        self.installs: list[tuple[_RegionRun, int]] = []

    def region(self, region: Region, top: bool, swap: bool) -> _RegionRun:
        if swap:
            _check_region(region, self.modules, self.used)
        members = [self.modules[p] for p in region.modules]
        stats = RegionStats(_region_name(region.modules))
        (self.stats if top else self.nested_stats).append(stats)
        run = _RegionRun(
            members,
            region.modules,
            [type(m) for m in members],
            region.policy,
            stats,
            self.reporter if top else None,
        )
        if swap:
            self.installs.extend((run, i) for i in range(len(members)))
        for child in region.children:
            self.child(region, run, child)
        return run

    def child(self, parent: Region, run: _RegionRun, child: Region) -> None:
        self.nested.append(child.modules)
        names = _region_name(child.modules)
        count = len(child.modules)
        for start in range(len(parent.modules) - count + 1):
            if parent.modules[start : start + count] == child.modules:
                if count == len(parent.modules):
                    raise CkptplanError(f"nested region {names} is its parent region; re-solve")
                if any(
                    s[2] is not None and s[0] < start + count and start < s[1] for s in run.steps
                ):
                    raise CkptplanError(f"nested region {names} overlaps another; re-solve")
                run.nest(start, start + count, self.region(child, top=False, swap=False))
                return
        inside = all(any(p.startswith(m + ".") for m in parent.modules) for p in child.modules)
        if not inside:
            raise CkptplanError(
                f"nested region {names} is neither a run of {_region_name(parent.modules)} nor "
                "inside it; re-solve the plan"
            )
        self.region(child, top=False, swap=True)

    def install(self) -> None:
        for run, index in self.installs:
            module = run.modules[index]
            module.__class__ = _member_class(type(module))
            module.__dict__["_ckptplan_member"] = (run, index)


def refuse_unapplicable(model: torch.nn.Module) -> None:
    """Refuse a model no plan can be applied to (checkpointed already, or wrapped by DDP, FSDP2
    or ``torch.compile``), before any plan is read or solved for it."""
    if getattr(model, "ckptplan_applied", None) is not None:
        raise CkptplanError(
            f"{type(model).__name__} is already checkpointed by ckptplan; apply a plan once"
        )
    _refuse_wrapped(model)


def apply(
    model: torch.nn.Module, plan: Plan | str | Path, force: bool = False, stage: int | None = None
) -> torch.nn.Module:
    """Checkpoint ``model`` in place as ``plan`` says, and return it.

    Refuses a model that is already checkpointed by ckptplan (or by Hugging Face), a model
    already wrapped by DDP, FSDP2 or ``torch.compile`` (apply comes first), and a model whose
    structure differs from the one the plan was made for (unless ``force``). The summary of
    what was wrapped is logged and kept as ``model.ckptplan_applied``, whose counters show the
    recomputations. Training with it then warns of a batch larger than the plan's, and refuses
    Hugging Face checkpointing switched on inside its regions (``ckptplan.guards``).

    With ``stage``, ``model`` is that pipeline stage's module and only its blocks are checked
    and checkpointed (``ckptplan.pipeline.stage_plan``).
    """
    plan = as_plan(plan)
    refuse_unapplicable(model)
    if stage is None:
        check_model_matches(model, plan, force)
    else:
        # Imported here: ckptplan.pipeline solves through ckptplan.api, which imports this module.
        from ckptplan.pipeline import stage_plan

        plan = stage_plan(model, plan, stage, force)
    for note in training_conventions(model)[1]:
        log.warning("ckptplan.apply: %s", note)
    applied = AppliedPlan(
        regions=tuple(r.modules for r in plan.regions),
        solver=plan.solver,
        policies=tuple(r.policy for r in plan.regions),
    )
    installer = _Installer(model, applied)
    for region in plan.regions:
        installer.region(region, top=True, swap=True)
    installer.install()
    applied.stats = tuple(installer.stats)
    applied.nested_stats = tuple(installer.nested_stats)
    applied.nested = tuple(installer.nested)
    model.ckptplan_applied = applied
    model.register_forward_pre_hook(BatchGuard(plan.inputs), with_kwargs=True)
    log.info("%s", applied)
    return model
