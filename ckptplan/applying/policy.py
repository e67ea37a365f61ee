"""Selective checkpointing at run time: what a region does with each op call it runs.

This module needs only torch, because it is the policy of two things: ``ckptplan.apply``'s
regions run it, and ``ckptplan rewrite`` copies its code (everything below the imports) into
the files it writes, so a rewritten model decides exactly as an applied one does. A policy's
op calls come as ``(op, k)`` pairs, as ``ckptplan.values.policy_types.OpCall`` holds them: the k-th
call of the overload ``namespace.op.overload`` in the region, counting from 0, or every call
for k None. (No ``from __future__`` import: the copy runs as written.)
"""

import functools
from collections import Counter
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

OpCalls = tuple[tuple[str, int | None], ...]
"""A policy's op calls: ``(namespace.op.overload, k)``, k None for every call."""


def op_overload(name: str) -> Any:
    """The torch op ``namespace.op.overload`` names (AttributeError when none)."""
    namespace, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload)


@functools.cache
def _resolved(calls: OpCalls) -> tuple[frozenset[Any], frozenset[tuple[Any, int]]]:
    """Ops named at every call, and (op, k) pairs named at their k-th call."""
    every = frozenset(op_overload(op) for op, k in calls if k is None)
    nth = frozenset((op_overload(op), k) for op, k in calls if k is not None)
    return every, nth


class Choices:
    """What a region's policy does with each op call: ``MUST_SAVE``, ``MUST_CPU_OFFLOAD`` or
    ``PREFER_RECOMPUTE``. Calls are counted per overload, separately in forward and recompute,
    so a recomputed call is told what its forward call was."""

    def __init__(self, saves: OpCalls, offloads: OpCalls = ()) -> None:
        self.named = (
            (CheckpointPolicy.MUST_SAVE, _resolved(saves)),
            (CheckpointPolicy.MUST_CPU_OFFLOAD, _resolved(offloads)),
        )
        self.counts: dict[bool, Counter[Any]] = {False: Counter(), True: Counter()}

    def __call__(self, func: Any, recompute: bool) -> tuple[CheckpointPolicy, int]:
        """The choice for this call of ``func``, and which call of it this is."""
        seen = self.counts[recompute]
        index = seen[func]
        seen[func] += 1
        for choice, (every, nth) in self.named:
            if func in every or (func, index) in nth:
                return choice, index
        return CheckpointPolicy.PREFER_RECOMPUTE, index


def selective_contexts(saves: OpCalls, offloads: OpCalls = ()) -> tuple[Any, Any]:
    """The selective-checkpoint contexts of one region call (op counts start at 0 in each).

    A plain function under ``functools.partial``, the ``context_fn`` form that both pickling and
    ``torch.compile`` accept.
    """
    choices = Choices(saves, offloads)

    def decide(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        choice = choices(func, ctx.is_recompute)[0]
        recompute = choice is CheckpointPolicy.PREFER_RECOMPUTE
        if recompute and _random(func) and torch.compiler.is_compiling():
            return CheckpointPolicy.MUST_SAVE  # see Note [random ops under torch.compile]
        return choice

    return create_selective_checkpoint_contexts(decide)


def selective(saves: OpCalls) -> functools.partial[tuple[Any, Any]]:
    """The ``context_fn`` of a region that keeps the op calls ``saves``."""
    return functools.partial(selective_contexts, saves)


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
