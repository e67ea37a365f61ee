"""What applying a plan did, and what its regions have done since: the counters of forwards
and recomputations, and the report of the first backward, so that a plan cannot be silently
not applied.

Nothing here runs while ``torch.compile`` traces (dynamo would guard on a counter it read and
recompile the model at every step): only eager regions count.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import register_multi_grad_hook

from ckptplan.applying.tensors import input_tensors
from ckptplan.values.policy_types import Policy

log = logging.getLogger("ckptplan")


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
    policies: tuple[Policy | None, ...] = ()
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
        names = ", ".join(region_name(r) for r in self.regions)
        text = f"ckptplan: checkpointed {len(self.regions)} regions ({self.solver}): {names}"
        selective = [
            f"{region_name(r)} keeps {_count(len(p.saves), 'op output')}"
            for r, p in zip(self.regions, self.policies, strict=True)
            if p
        ]
        if selective:
            text += "; selective: " + "; ".join(selective)
        if self.nested:
            text += "; nested: " + ", ".join(region_name(r) for r in self.nested)
        return text


def region_name(modules: tuple[str, ...]) -> str:
    """A region as logs and errors name it: its modules joined by ``+``."""
    return "+".join(modules)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


class Reporter:
    """Logs, once, how many regions the first backward recomputed (eager mode).

    Note [the end of the first backward]
        No public torch API calls back at the end of a backward, so the report waits instead
        for the backward to finish every region call that ran forward: a call has finished
        when the gradients of what it consumed (its inputs and parameters that require grad)
        are computed. ``register_multi_grad_hook`` (mode ``all``) tells that, and ignores
        tensors the backward does not reach; FSDP2's sharded parameters, which get no autograd
        gradient, are left out. A call none of whose tensors the backward reaches keeps the
        report waiting: the next region forward after a backward makes it then.
    """

    def __init__(self, applied: AppliedPlan) -> None:
        self.applied = applied
        self.waiting = 0
        """Region calls of this step whose backward has not finished."""
        self.backward_seen = False
        self.handles: list[Any] = []
        self.done = False

    def before_forward(self) -> None:
        """A region is about to run forward: a backward since the last forward ended the step."""
        if self.backward_seen and not self.done:
            self._report()

    def watch(self, inputs: Any, modules: list[torch.nn.Module]) -> None:
        """Wait for the gradients of what a region call consumed: its ``inputs`` and the
        parameters of its member ``modules`` (read only until the report is made)."""
        if self.done:
            return
        params = [p for m in modules for p in m.parameters()]
        consumed = [*input_tensors(inputs), *params]
        unique = {id(t): t for t in consumed if t.requires_grad and _autograd_tensor(t)}
        if not unique:
            return
        self.waiting += 1
        hook = register_multi_grad_hook(list(unique.values()), self._finished, mode="all")
        self.handles.append(hook)

    def _finished(self, grads: Sequence[torch.Tensor | None]) -> None:
        self.backward_seen = True
        self.waiting -= 1
        if self.waiting == 0 and not self.done:
            self._report()

    def _report(self) -> None:
        self.done = True
        for handle in self.handles:
            handle.remove()
        self.handles = []
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


def _autograd_tensor(t: torch.Tensor) -> bool:
    """A plain tensor or parameter, whose gradient autograd computes (not a tensor subclass
    such as FSDP2's sharded DTensor parameters)."""
    return type(t) in (torch.Tensor, torch.nn.Parameter)
