"""The graph and schedules that the exact rematerialization search works on (internal; plain
integers only).

Everything works on an ``IndexedGraph``: nodes renumbered by their position in the topological
order ``T`` that fixes the order of first computations. A schedule is kept as *stages*: stage
``t`` lists the nodes computed after the first computation of ``T[t-1]``, ending with that of
``T[t]``. In *stage form* (the shape of Checkmate's formulation) each stage runs distinct nodes
in order ``T``; depth-first heuristic schedules need not.

Three tools behind ``ckptplan.solvers.remat.solve`` cooperate on it:

* ``remat_cpsat.order_bound`` solves a small covering relaxation: every value must be resident
  at the first computation of itself and of each reader, dropping it for a gap between two such
  steps costs one recomputation, and memory at every first computation must fit. Its optimum
  bounds the cost of every schedule whose first computations follow ``T`` (recomputing
  anything, anywhere) and its solution says which values to drop where.
* ``remat_heuristics.heuristic_schedules`` turns such drops (or plain eviction rules) into valid
  schedules fast.
* ``remat_cpsat.StageModel`` is the exact CP-SAT stage model; memory inside stages
  (recomputation steps) is added lazily, only for stages whose solution overflowed
  (``remat_cpsat.improve``).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

Stages = list[list[int]]
#: A drop ``(i, b)``: value ``i`` is not kept through the gap that ends at its reader ``b``.
Drop = tuple[int, int]


class IndexedGraph:
    """Nodes renumbered by position in a topological order, so every edge goes forward."""

    def __init__(
        self,
        ids: Sequence[int],
        cost: Sequence[int],
        mem: Sequence[int],
        edges: Sequence[tuple[int, int]],
    ) -> None:
        index = {node_id: i for i, node_id in enumerate(ids)}
        self.n = len(ids)
        self.ids = list(ids)
        self.cost = list(cost)
        self.mem = list(mem)
        self.preds: list[list[int]] = [[] for _ in ids]
        self.succs: list[list[int]] = [[] for _ in ids]
        for u, v in set(edges):
            i, j = index[u], index[v]
            if i >= j:
                raise ValueError("order is not topological")
            self.preds[j].append(i)
            self.succs[i].append(j)
        for lst in (*self.preds, *self.succs):
            lst.sort()
        self.last_use = [s[-1] if s else -1 for s in self.succs]
        # Furthest first computation that i can still serve: no use computing i after it.
        self.reach = list(range(self.n))
        for i in reversed(range(self.n)):
            for j in self.succs[i]:
                self.reach[i] = max(self.reach[i], self.reach[j])

    def next_use(self, v: int, t: int) -> int:
        """First reader of ``v`` after stage ``t`` (``n`` if none)."""
        users = self.succs[v]
        pos = bisect.bisect_right(users, t)
        return users[pos] if pos < len(users) else self.n


def cost_of(g: IndexedGraph, stages: Stages) -> int:
    """Total compute, recomputations included."""
    return sum(g.cost[k] for stage in stages for k in stage)


def memory_profile(g: IndexedGraph, stages: Stages) -> list[int]:
    """Memory at every step: each copy lives from its step through the last step reading it."""
    steps = [k for stage in stages for k in stage]
    latest: dict[int, int] = {}
    last_read: list[int] = []
    for step, k in enumerate(steps):
        for p in g.preds[k]:
            last_read[latest[p]] = step
        latest[k] = step
        last_read.append(step)
    delta = [0] * (len(steps) + 1)
    for step, k in enumerate(steps):
        delta[step] += g.mem[k]
        delta[last_read[step] + 1] -= g.mem[k]
    profile = []
    running = 0
    for d in delta[:-1]:
        running += d
        profile.append(running)
    return profile


def peak_of(g: IndexedGraph, stages: Stages) -> int:
    """Peak of ``memory_profile``."""
    return max(memory_profile(g, stages), default=0)


def overflowing_stages(g: IndexedGraph, stages: Stages, budget: int) -> set[int]:
    """Stages with a step above the budget."""
    profile = memory_profile(g, stages)
    owner = [t for t, stage in enumerate(stages) for _ in stage]
    return {owner[step] for step, m in enumerate(profile) if m > budget}


def prune(g: IndexedGraph, stages: Stages) -> Stages:
    """Drop recomputations whose copy nobody reads (repeatedly): cheaper, never more memory."""
    while True:
        steps = [(t, k) for t, stage in enumerate(stages) for k in stage]
        latest: dict[int, int] = {}
        read = [False] * len(steps)
        for step, (_, k) in enumerate(steps):
            for p in g.preds[k]:
                read[latest[p]] = True
            latest[k] = step
        useless = {step for step, (t, k) in enumerate(steps) if not read[step] and k != t}
        if not useless:
            return stages
        kept: Stages = [[] for _ in stages]
        for step, (t, k) in enumerate(steps):
            if step not in useless:
                kept[t].append(k)
        stages = kept
