"""Search machinery behind ``ckptplan.solvers.remat.solve`` (internal; plain integers only).

Everything works on an ``IndexedGraph``: nodes renumbered by their position in the topological
order ``T`` that fixes the order of first computations. A schedule is kept as *stages*: stage
``t`` lists the nodes computed after the first computation of ``T[t-1]``, ending with that of
``T[t]``. In *stage form* (the shape of Checkmate's formulation) each stage runs distinct nodes
in order ``T``; depth-first heuristic schedules need not.

Three tools cooperate:

* ``order_bound`` solves a small covering relaxation: every value must be resident at the first
  computation of itself and of each reader, dropping it for a gap between two such steps costs
  one recomputation, and memory at every first computation must fit. Its optimum bounds the
  cost of every schedule whose first computations follow ``T`` (recomputing anything, anywhere)
  and its solution says which values to drop where.
* ``heuristic_schedules`` turns such drops (or plain eviction rules) into valid schedules fast.
* ``StageModel`` is the exact CP-SAT stage model; memory inside stages (recomputation steps) is
  added lazily, only for stages whose solution overflowed (``improve``).
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

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


# --- heuristics --------------------------------------------------------------------------------

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


# --- CP-SAT: the covering bound -----------------------------------------------------------------


def _solver(time_limit: float, workers: int) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    solver.parameters.max_time_in_seconds = max(0.01, time_limit)
    return solver


def _stage_solver(time_limit: float, workers: int) -> cp_model.CpSolver:
    """Proofs here come from the LP with every clause linearized, so the workers are the full
    LP worker and the core-based bound worker: the best of the portfolios tried on 2 cores
    (CP-SAT's default pair never raised the bound on these models)."""
    solver = _solver(time_limit, workers)
    if workers == 1:
        solver.parameters.linearization_level = 2
    elif workers == 2:
        solver.parameters.subsolvers.extend(["max_lp", "core"])
    return solver


class _StopAtBound(cp_model.CpSolverSolutionCallback):
    """Stops the search once a solution reaches a bound proven elsewhere (CP-SAT may not see
    it as its own objective bound)."""

    def __init__(self, bound: int) -> None:
        super().__init__()
        self.bound = bound

    def on_solution_callback(self) -> None:
        if self.objective_value <= self.bound:
            self.stop_search()


def order_bound(
    g: IndexedGraph, budget: int, time_limit: float, workers: int
) -> tuple[int, set[Drop]]:
    """Lower bound on the recomputation cost of any schedule whose first computations follow
    ``T``, and the drops of the best covering solution found.

    The relaxation ignores what a recomputation itself needs (its inputs, its own peak), so it
    is small (one boolean per gap between two reads of a value) and CP-SAT closes it quickly.
    """
    model = cp_model.CpModel()
    live = [0] * (g.n + 1)
    for i in range(g.n):
        live[i] += g.mem[i]
        live[max(i, g.last_use[i]) + 1] -= g.mem[i]
    resident = []
    running = 0
    for t in range(g.n):
        running += live[t]
        resident.append(running)
    gaps: dict[Drop, cp_model.IntVar] = {}
    covering: list[list[tuple[int, cp_model.IntVar]]] = [[] for _ in range(g.n)]
    for i in range(g.n):
        required = [i, *g.succs[i]]
        for a, b in itertools.pairwise(required):
            if b - a > 1 and any(resident[t] > budget for t in range(a + 1, b)):
                d = model.new_bool_var(f"d{i}_{b}")
                gaps[(i, b)] = d
                for t in range(a + 1, b):
                    covering[t].append((g.mem[i], d))
    for t in range(g.n):
        if resident[t] > budget:
            model.add(sum(m * d for m, d in covering[t]) >= resident[t] - budget)
    model.minimize(sum(g.cost[i] * d for (i, _), d in gaps.items()))
    solver = _solver(time_limit, workers)
    status = solver.solve(model)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        bound = math.ceil(solver.best_objective_bound - 1e-6)
        return bound, {gap for gap, d in gaps.items() if solver.boolean_value(d)}
    return 0, set()


# --- CP-SAT: the stage model --------------------------------------------------------------------


class StageModel:
    """Checkmate's stage formulation with frees, as CP-SAT booleans.

    ``R[t][i]``: stage ``t`` computes ``i``; ``S[t][i]``: a copy of ``i`` is resident when stage
    ``t`` starts and is read later; ``F[t][(i, k)]``: ``i`` is freed right after step ``k`` of
    stage ``t``; ``U[t][k]``: memory after step ``k``. Every stage gets the exact memory at its
    own first computation (a knapsack over what is carried on); only stages in ``exact`` get the
    frees and running sums that bound the memory at recomputation steps too.
    """

    def __init__(self, g: IndexedGraph, budget: int, exact: set[int], lower: int) -> None:
        self.g = g
        n = g.n
        scale = math.gcd(*g.mem) or 1
        self.mem = [m // scale for m in g.mem]
        self.cap = budget // scale
        model = cp_model.CpModel()
        self.model = model
        self.R: list[dict[int, cp_model.IntVar]] = []
        self.S: list[dict[int, cp_model.IntVar]] = []
        self.F: list[dict[tuple[int, int], cp_model.IntVar]] = [{} for _ in range(n)]
        self.U: list[dict[int, cp_model.IntVar]] = [{} for _ in range(n)]
        for t in range(n):
            self.R.append(
                {
                    i: model.new_bool_var(f"R{t}_{i}")
                    for i in range(t + 1)
                    if i == t or g.reach[i] >= t
                }
            )
            self.S.append(
                {
                    i: model.new_bool_var(f"S{t}_{i}")
                    for i in range(t)
                    if g.succs[i] and g.reach[i] >= t
                }
            )
        objective = []
        for t in range(n):
            R, S = self.R[t], self.S[t]
            nxt = self.S[t + 1] if t + 1 < n else {}
            model.add(R[t] == 1)
            for i, r in R.items():
                if i < t:
                    model.add_bool_or([r.Not(), S[i].Not()])
                    objective.append(g.cost[i] * r)
                for p in g.preds[i]:
                    model.add_bool_or([r.Not(), R[p], S[p]])
            for i, s in nxt.items():
                model.add_bool_or([s.Not(), R[i], *([S[i]] if i in S else [])])
            # Only useful work: a recomputed or carried value is read here or carried on.
            for i, x in [*((i, r) for i, r in R.items() if i < t), *S.items()]:
                readers = [R[j] for j in g.succs[i] if j in R]
                model.add_bool_or([x.Not(), *readers, *([nxt[i]] if i in nxt else [])])
            fixed = self.mem[t] + sum(self.mem[p] for p in g.preds[t])
            model.add(
                sum(self.mem[i] * s for i, s in nxt.items() if i != t and i not in g.preds[t])
                <= self.cap - fixed
            )
            if t in exact:
                self._exact_stage(t)
        total = sum(objective)
        model.add(total >= lower)
        model.minimize(total)

    def _exact_stage(self, t: int) -> None:
        g, model, mem = self.g, self.model, self.mem
        R, S = self.R[t], self.S[t]
        nxt = self.S[t + 1] if t + 1 < g.n else {}
        frees = self.F[t]
        for i in sorted(set(R) | set(S)):
            readers = [j for j in g.succs[i] if j in R]
            for k in ([i] if i in R else []) + readers:
                f = model.new_bool_var(f"F{t}_{i}_{k}")
                frees[(i, k)] = f
                blockers = [R[j] for j in readers if j > k] + ([nxt[i]] if i in nxt else [])
                model.add_implication(f, R[k])
                for x in blockers:
                    model.add_bool_or([f.Not(), x.Not()])
                model.add_bool_or([R[k].Not(), *blockers, f])
        freed_after: dict[int, list[tuple[int, cp_model.IntVar]]] = {}
        for (i, k), f in frees.items():
            freed_after.setdefault(k, []).append((i, f))
        previous = cp_model.LinearExpr.sum([mem[i] * s for i, s in S.items()])
        prev_k: int | None = None
        for k in sorted(R):
            u = model.new_int_var(0, self.cap, f"U{t}_{k}")
            freed = freed_after.get(prev_k, []) if prev_k is not None else []
            released = cp_model.LinearExpr.sum([mem[i] * f for i, f in freed])
            model.add(u == previous - released + mem[k] * R[k])
            self.U[t][k] = u
            previous, prev_k = u, k

    def hint(self, stages: Stages) -> None:
        """Hint every variable from a valid stage schedule, as the model would value it."""
        g, n, mem, model = self.g, self.g.n, self.mem, self.model
        computed = [set(stage) for stage in stages]
        # A copy of i made in stage s and last read in stage l is in S[t] for s < t <= l.
        resident: list[set[int]] = [set() for _ in range(n + 1)]
        latest: dict[int, int] = {}
        for t, stage in enumerate(stages):
            for k in stage:
                for p in g.preds[k]:
                    for later_stage in range(latest[p] + 1, t + 1):
                        resident[later_stage].add(p)
                latest[k] = t
        for t in range(n):
            for i, r in self.R[t].items():
                model.add_hint(r, i in computed[t])
            for i, s in self.S[t].items():
                model.add_hint(s, i in resident[t])
            freed: dict[int, int] = {}
            for (i, k), f in self.F[t].items():
                later = any(j in computed[t] for j in g.succs[i] if j > k)
                value = k in computed[t] and not later and i not in resident[t + 1]
                model.add_hint(f, value)
                if value:
                    freed[k] = freed.get(k, 0) + mem[i]
            running = sum(mem[i] for i in self.S[t] if i in resident[t])
            prev_k: int | None = None
            for k, u in self.U[t].items():
                released = freed.get(prev_k, 0) if prev_k is not None else 0
                running += (mem[k] if k in computed[t] else 0) - released
                model.add_hint(u, running)
                prev_k = k

    def stages(self, solver: cp_model.CpSolver) -> Stages:
        return [
            sorted(i for i, r in self.R[t].items() if solver.boolean_value(r))
            for t in range(self.g.n)
        ]


def stage_model_size(g: IndexedGraph) -> int:
    """Booleans ``R`` and ``S`` the stage model would have."""
    return sum(2 * sum(1 for i in range(t + 1) if g.reach[i] >= t) for t in range(g.n))


@dataclass
class Outcome:
    """What ``improve`` reached: the best valid schedule, the proven bound on recomputation
    cost in the stage model, and whether that proves the schedule optimal (or none exists)."""

    stages: Stages | None
    bound: int
    optimal: bool = False
    infeasible: bool = False


def improve(
    g: IndexedGraph,
    budget: int,
    incumbent: Stages | None,
    lower: int,
    deadline: float,
    workers: int,
) -> Outcome:
    """Improve ``incumbent`` with the stage model until ``deadline`` or a proof of optimality.

    Stages whose solution overflows between first computations get their exact memory model
    and the model is solved again; each solve starts from the best valid schedule so far.
    """
    exact: set[int] = set()
    best, bound = incumbent, lower
    base = sum(g.cost)
    while deadline - time.perf_counter() > 0.05:
        model = StageModel(g, budget, exact, lower=bound)
        if best is not None:
            model.hint(best)
        solver = _stage_solver(deadline - time.perf_counter(), workers)
        status = solver.solve(model.model, _StopAtBound(bound))
        if status == cp_model.INFEASIBLE:
            return Outcome(best, bound, infeasible=best is None)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            break
        bound = max(bound, math.ceil(solver.best_objective_bound - 1e-6))
        stages = prune(g, model.stages(solver))
        over = overflowing_stages(g, stages, budget)
        if not over and (best is None or cost_of(g, stages) < cost_of(g, best)):
            best = stages
        if best is not None and cost_of(g, best) - base <= bound:
            return Outcome(best, cost_of(g, best) - base, optimal=True)
        # A relaxed optimum (or a solution at the bound) that overflows inside some stage:
        # model those stages exactly and solve again. Anything else means time is up.
        if not over or (status != cp_model.OPTIMAL and cost_of(g, stages) - base > bound):
            break
        exact |= over
    return Outcome(best, bound)
