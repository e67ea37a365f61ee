"""What applying a plan did, and what its regions have done since: the counters of forwards
and recomputations, and the report of the first backward, so that a plan cannot be silently
not applied.

Nothing here runs while ``torch.compile`` traces (dynamo would guard on a counter it read and
recompile the model at every step): only eager regions count.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from ckptplan.applying.tensors import first_tensor
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
            # Private, for want of a public route (torch 2.11 to 2.14): only the engine's
            # callback runs at the end of the backward. A multi-grad hook on the parameters
            # would never fire under FSDP2, whose sharded parameters get no autograd gradient.
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
