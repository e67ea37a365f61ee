"""CP-SAT for the exact rematerialization search (internal; plain integers only).

``order_bound`` solves the covering relaxation that bounds every schedule whose first
computations follow ``T``; ``StageModel`` is Checkmate's exact stage model, which ``improve``
solves with memory inside stages added lazily, only for stages whose solution overflowed.
Schedules are stages over an ``IndexedGraph`` (``remat_graph``).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from ckptplan.solvers.remat_graph import (
    Drop,
    IndexedGraph,
    Stages,
    cost_of,
    overflowing_stages,
    prune,
)

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
