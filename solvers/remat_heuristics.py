"""Fast valid schedules for the exact rematerialization search (internal; plain integers only).

``heuristic_schedules`` runs ``T`` stage by stage, evicting values by several rules (and
following the drops of ``remat_cpsat.order_bound`` when given), and rebuilds depth-first on
demand; ``low_memory_order`` looks for another topological order that fits without
recomputation. Schedules are stages over an ``IndexedGraph`` (``remat_graph``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from ckptplan.solvers.remat_graph import Drop, IndexedGraph, Stages, cost_of, peak_of, prune

#: Eviction priority from (bytes freed, steps until needed again, cost to rebuild): highest goes.
Score = Callable[[int, int, int], float]


def _stage_peak(g: IndexedGraph, t: int, carried: set[int], need: list[int], kept: set[int]) -> int:
    """Peak inside stage ``t``: ``carried`` enters, ``need`` runs in order, ``kept`` leaves."""
    readers: dict[int, int] = {}
    for k in need:
        for p in g.preds[k]:
            readers[p] = readers.get(p, 0) + 1
    mem = sum(g.mem[v] for v in carried if readers.get(v, 0) > 0 or v in kept)
    peak = 0
    for k in need:
        mem += g.mem[k]
        peak = max(peak, mem)
        for p in g.preds[k]:
            readers[p] -= 1
            if readers[p] == 0 and p not in kept:
                mem -= g.mem[p]
        if readers.get(k, 0) == 0 and k not in kept:
            mem -= g.mem[k]
    return peak


def _closure(g: IndexedGraph, t: int, carried: set[int]) -> list[int]:
    """What stage ``t`` must compute: ``t`` and, recursively, every input not carried in."""
    need = {t}
    stack = [t]
    while stack:
        for p in g.preds[stack.pop()]:
            if p not in carried and p not in need:
                need.add(p)
                stack.append(p)
    return sorted(need)


class _Stage:
    """One candidate plan for stage ``t`` of the eviction heuristic.

    ``carried`` enters the stage, ``need`` is computed, ``kept`` leaves it. A value leaves when
    nothing reads it later, when it is evicted (``dropped``) or planned away by a ``drops``
    gap; a copy recomputed inside such a gap for another reader (``fresh``) stays to the gap's
    end. A value that leaves while still needed will be rebuilt, so its inputs are kept until
    then (``support``: value -> stage it must reach) instead of being rebuilt in a cascade.
    """

    def __init__(
        self,
        g: IndexedGraph,
        t: int,
        carried: set[int],
        dropped: set[int],
        drops: set[Drop],
        fresh: set[int],
        support: dict[int, int],
    ) -> None:
        self.carried, self.dropped = carried, dropped
        self.need = _closure(g, t, carried)
        available = carried.union(self.need)
        exempt = fresh.union(self.need).difference(g.preds[t], [t])
        self.kept = {
            v
            for v in available
            if v not in dropped
            and (
                support.get(v, -1) > t
                or (g.last_use[v] > t and (v in exempt or (v, g.next_use(v, t)) not in drops))
            )
        }
        self.support: dict[int, int] = {}
        stack = [(w, h) for w in available - self.kept if (h := _needed_at(g, w, t, support)) < g.n]
        seen: set[int] = set()
        while stack:
            w, h = stack.pop()
            for p in g.preds[w]:
                if p in self.kept or (p in available and p not in dropped):
                    self.kept.add(p)
                    self.support[p] = max(self.support.get(p, -1), h)
                elif p not in seen:
                    seen.add(p)
                    stack.append((p, h))
        self.peak = _stage_peak(g, t, carried, self.need, self.kept)


def _needed_at(g: IndexedGraph, v: int, t: int, support: dict[int, int]) -> int:
    """Next stage after ``t`` that needs ``v``: a first computation reading it, or a rebuild."""
    horizon = support.get(v, g.n)
    return min(g.next_use(v, t), horizon if horizon > t else g.n)


def _stages_with_evictions(
    g: IndexedGraph, budget: int, score: Score, drops: set[Drop], deadline: float
) -> Stages | None:
    """Run ``T`` stage by stage; values in ``drops`` are let go, and whenever a stage still
    overflows the value with the highest ``score`` is evicted (rebuilt where next needed).
    ``None`` when some stage cannot fit or ``deadline`` passes."""
    carried: set[int] = set()
    fresh: set[int] = set()
    support: dict[int, int] = {}
    stages: Stages = []
    for t in range(g.n):
        plan = _Stage(g, t, carried, set(), drops, fresh, support)
        while plan.peak > budget:
            if time.perf_counter() > deadline:
                return None
            present = plan.carried.union(plan.need)

            def priority(v: int, t: int = t, present: set[int] = present) -> float:
                rebuild = g.cost[v] + sum(g.cost[p] for p in g.preds[v] if p not in present)
                return score(g.mem[v], _needed_at(g, v, t, support) - t, rebuild)

            candidates = sorted(plan.carried | plan.kept, key=priority, reverse=True)
            if not candidates:
                return None
            best: _Stage | None = None
            for v in candidates[:8]:
                trial = _Stage(
                    g,
                    t,
                    plan.carried - {v},
                    plan.dropped | ({v} - plan.carried),
                    drops,
                    fresh,
                    support,
                )
                if best is None or trial.peak < best.peak:
                    best = trial
                if trial.peak < plan.peak:
                    break
            assert best is not None
            plan = best
        stages.append(plan.need)
        fresh = plan.kept.intersection(fresh.union(plan.need)).difference(g.preds[t], [t])
        for v, h in plan.support.items():
            support[v] = max(support.get(v, -1), h)
        carried = plan.kept
    return prune(g, stages)


def _scores(g: IndexedGraph) -> list[Score]:
    """Eviction rules: bytes freed for how long, per unit of recomputation (and variants)."""
    eps = max(1, min((c for c in g.cost if c > 0), default=1)) / 10

    def size_time_per_cost(mem: int, wait: int, rebuild: int) -> float:
        return mem * wait / (rebuild + eps)

    def size_per_cost(mem: int, wait: int, rebuild: int) -> float:
        return mem / (rebuild + eps)

    def furthest_use(mem: int, wait: int, rebuild: int) -> float:
        return wait

    def size_time(mem: int, wait: int, rebuild: int) -> float:
        return mem * wait

    return [size_time_per_cost, size_per_cost, furthest_use, size_time]


def _on_demand(g: IndexedGraph, budget: int, score: Score, deadline: float) -> Stages | None:
    """DTR-style schedule: run ``T``; rebuild missing inputs depth-first right before they are
    read, evicting the best-scored unpinned value whenever an output does not fit. Values stay
    until evicted or the stage ends, so shared ancestors are not rebuilt once per reader.

    Depth-first rebuilding can hold less memory than a stage computed in order ``T``, so this
    sometimes fits where stages cannot; its schedules are usually not in stage form (see
    ``is_stage_form``). ``None`` when an output cannot fit or ``deadline`` passes.
    """
    resident: set[int] = set()
    pins = [0] * g.n
    wanted = [0] * g.n
    mem = 0
    stages: Stages = []
    for t in range(g.n):
        steps: list[int] = []
        stack: list[tuple[int, set[int]]] = [(t, set())]
        for p in g.preds[t]:
            wanted[p] += 1
        while stack:
            if len(steps) % 256 == 255 and time.perf_counter() > deadline:
                return None
            v, pinned = stack[-1]
            missing = [p for p in g.preds[v] if p not in resident]
            if missing:
                child = max(
                    missing,
                    key=lambda p: (
                        g.mem[p] + sum(g.mem[q] for q in g.preds[p] if q not in resident),
                        p,
                    ),
                )
                stack.append((child, set()))
                for p in g.preds[child]:
                    wanted[p] += 1
                continue
            for p in g.preds[v]:
                if p not in pinned:
                    pinned.add(p)
                    pins[p] += 1
            while mem + g.mem[v] > budget:
                victims = [u for u in resident if pins[u] == 0]
                if not victims or time.perf_counter() > deadline:
                    return None
                u = max(
                    victims,
                    key=lambda u: (
                        wanted[u] == 0,
                        score(
                            g.mem[u],
                            g.next_use(u, t) - t,
                            g.cost[u] + sum(g.cost[q] for q in g.preds[u] if q not in resident),
                        ),
                        u,
                    ),
                )
                resident.discard(u)
                mem -= g.mem[u]
            resident.add(v)
            mem += g.mem[v]
            steps.append(v)
            stack.pop()
            for p in g.preds[v]:
                wanted[p] -= 1
            for p in pinned:
                pins[p] -= 1
            if stack:
                parent_pins = stack[-1][1]
                parent_pins.add(v)
                pins[v] += 1
        for v in [v for v in resident if g.last_use[v] <= t]:
            resident.discard(v)
            mem -= g.mem[v]
        stages.append(steps)
    return prune(g, stages)


def is_stage_form(stages: Stages) -> bool:
    """Whether each stage runs distinct nodes in order ``T``, as the stage model requires."""
    return all(all(a < b for a, b in itertools.pairwise(stage)) for stage in stages)


def heuristic_schedules(
    g: IndexedGraph, budget: int, drops: set[Drop], deadline: float
) -> tuple[Stages | None, Stages | None]:
    """The cheapest valid schedule found by the heuristics, and the cheapest in stage form.

    Tried with every eviction rule: stage-by-stage eviction (following ``drops`` and without)
    and depth-first rebuilding (as found, and sorted into stage form when that still fits).
    Rules still untried at ``deadline`` are skipped.
    """
    found: list[Stages] = []
    for plan in [drops, set()] if drops else [set()]:
        for score in _scores(g):
            stages = _stages_with_evictions(g, budget, score, plan, deadline)
            if stages is not None:
                found.append(stages)
    for score in _scores(g):
        stages = _on_demand(g, budget, score, deadline)
        if stages is not None:
            found.append(stages)
            found.append(prune(g, [sorted(set(stage)) for stage in stages]))
    valid = [stages for stages in found if peak_of(g, stages) <= budget]
    staged = [stages for stages in valid if is_stage_form(stages)]
    best = min(valid, key=lambda s: cost_of(g, s), default=None)
    return best, min(staged, key=lambda s: cost_of(g, s), default=None)


def low_memory_order(g: IndexedGraph) -> list[int]:
    """A topological order that always runs the ready node growing memory the least.

    Budgets are relative to ``T``; on graphs with many independent branches another order
    often fits without any recomputation, which no model over ``T`` can find.
    """
    waiting = [len(p) for p in g.preds]
    readers_left = [len(s) for s in g.succs]
    ready = {v for v in range(g.n) if waiting[v] == 0}
    order: list[int] = []

    def growth(v: int) -> tuple[int, int]:
        freed = sum(g.mem[p] for p in g.preds[v] if readers_left[p] == 1)
        return (g.mem[v] if g.succs[v] else 0) - freed, v

    while ready:
        v = min(ready, key=growth)
        ready.discard(v)
        order.append(v)
        for p in g.preds[v]:
            readers_left[p] -= 1
        for s in g.succs[v]:
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.add(s)
    return order
