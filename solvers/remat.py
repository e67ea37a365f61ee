"""Optimal rematerialization on general graphs (torch-free; CP-SAT).

The problem (the Checkmate instances' README, ``shared/remat-instances/README.md`` beside the
repository): a DAG of ops, each with a compute cost and the size of its one output. A schedule
is a sequence of node ids in which a node may appear again (a recomputation); a copy is
resident from the step that makes it through the last step that reads it. Find the cheapest
schedule whose peak memory fits a budget.

How ``solve`` proves things, from the broadest claim to the narrowest:

* ``memory_lower_bound``: no schedule at all fits below it, so such budgets are infeasible.
* ``RematSchedule.order_bound``: a covering relaxation bounds the cost of every schedule whose
  first computations follow the topological order ``T`` (recomputing anything, any number of
  times, anywhere). A schedule that meets it is optimal in that whole class, which contains
  Moccasin's (at most two computations per node, first computations in ``T``).
* ``RematSchedule.lower_bound``: Checkmate's stage model (stage ``t`` recomputes some earlier
  nodes in the order ``T`` and ends with the first computation of ``T[t]``), solved by CP-SAT;
  "optimal" without the first kind of proof means optimal within this model.

This module holds the answer and the search's order of play. The instance and its reading are
in ``remat_problem``; the indexed graph and stage schedules in ``remat_graph``; the heuristic
schedules in ``remat_heuristics``; the covering bound and the stage model in ``remat_cpsat``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction

from ckptplan.solvers import remat_cpsat as cpsat
from ckptplan.solvers import remat_heuristics as heuristics
from ckptplan.solvers.remat_graph import IndexedGraph, Stages, cost_of, peak_of
from ckptplan.solvers.remat_problem import (
    RematNode,
    RematProblem,
    load_instance,
    topological_order,
)

__all__ = [
    "RematNode",
    "RematProblem",
    "RematSchedule",
    "Status",
    "greedy_schedule",
    "load_instance",
    "memory_budget",
    "memory_lower_bound",
    "peak_without_recomputation",
    "solve",
    "topological_order",
]

#: Graphs whose stage model would have more booleans than this skip it (ResNet-50 has 125,000):
#: building and presolving it would eat the time limit. They get the heuristic schedules and
#: the covering bound.
MAX_STAGE_MODEL_BOOLEANS = 200_000


class Status(str, Enum):
    """How far the solver got; ``RematSchedule.reason`` says what a proof covers."""

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class RematSchedule:
    """The solver's answer; ``order`` is empty when no schedule was found.

    ``cost`` includes recomputations. ``order_bound`` bounds the cost of every schedule whose
    first computations follow ``T``. ``lower_bound`` (never above ``cost``) is the best bound
    proven for the class the status speaks about: the T-first class, the stage model when
    its bound is higher, or just ``total_cost`` for a schedule over another order that beats
    every T-first one. ``gap = (cost - lower_bound) / cost``; ``reason`` says why.
    """

    status: Status
    order: list[int]
    cost: int | None
    peak: int | None
    budget: int
    lower_bound: int
    order_bound: int
    gap: float | None
    solve_seconds: float
    total_cost: int
    reason: str

    @property
    def overhead(self) -> float | None:
        """Extra compute over no recomputation, ``cost / sum(c) - 1``."""
        if self.cost is None or self.total_cost == 0:
            return None
        return self.cost / self.total_cost - 1


def peak_without_recomputation(problem: RematProblem, order: Sequence[int] | None = None) -> int:
    """Peak memory of running ``order`` (default ``T``) once, freeing outputs after their last
    read: the ``peak(T)`` that budgets are relative to."""
    g = _indexed(problem, order)
    return peak_of(g, [list(range(g.n))])


def _indexed(problem: RematProblem, order: Sequence[int] | None) -> IndexedGraph:
    order = topological_order(problem) if order is None else list(order)
    by_id = {node.id: node for node in problem.nodes}
    if len(order) != len(by_id) or set(order) != set(by_id):
        raise ValueError("order must list every node exactly once")
    return IndexedGraph(
        order, [by_id[v].cost for v in order], [by_id[v].mem for v in order], problem.edges
    )


def memory_budget(problem: RematProblem, ratio: float | Fraction) -> int:
    """The benchmark's budget ``ceil(peak(T) * ratio)``, with ``ratio`` read as a decimal.

    ``Fraction(str(0.9))`` is exactly 9/10, so no float rounding can move the ceiling.
    """
    if ratio <= 0:
        raise ValueError(f"memory ratio must be positive, got {ratio}")
    return math.ceil(peak_without_recomputation(problem) * Fraction(str(ratio)))


def memory_lower_bound(problem: RematProblem) -> int:
    """Memory no schedule can go below: a budget under it is infeasible.

    Two facts about any valid schedule: when ``v`` runs, its inputs and its output are resident
    (the README's bound); and when the last-made input copy ``p`` that ``v`` reads is produced,
    the other inputs of ``v`` are already resident next to ``p`` and ``p``'s own inputs. The
    second is minimised over the choice of ``p``.
    """
    mem = {node.id: node.mem for node in problem.nodes}
    preds: dict[int, set[int]] = {node.id: set() for node in problem.nodes}
    for u, v in problem.edges:
        preds[v].add(u)
    bound = 0
    for v, inputs in preds.items():
        bound = max(bound, mem[v] + sum(mem[u] for u in inputs))
        if inputs:
            second = min(mem[p] + sum(mem[u] for u in (inputs - {p}) | preds[p]) for p in inputs)
            bound = max(bound, second)
    return bound


def greedy_schedule(
    problem: RematProblem,
    budget: int,
    order: Sequence[int] | None = None,
    time_limit_s: float = 10.0,
) -> list[int] | None:
    """A valid schedule within ``budget`` found fast (or ``None``): the solver's warm start.

    First computations follow ``order`` (default ``T``). Stage by stage, missing inputs are
    rebuilt before they are read; when memory overflows, the value freeing the most bytes for
    the longest time per unit of rebuilding is evicted (its inputs are kept for the rebuild).
    Several eviction rules and a depth-first variant are tried; the cheapest schedule wins.
    """
    g = _indexed(problem, order)
    stages, _ = heuristics.heuristic_schedules(g, budget, set(), time.perf_counter() + time_limit_s)
    return None if stages is None else _ids(g, stages)


def _ids(g: IndexedGraph, stages: Stages) -> list[int]:
    return [g.ids[k] for stage in stages for k in stage]


def solve(
    problem: RematProblem,
    budget: int,
    time_limit_s: float = 60.0,
    *,
    workers: int = 2,
) -> RematSchedule:
    """Cheapest schedule with peak memory ``<= budget``, anytime within ``time_limit_s``.

    In turn: the memory lower bound (an infeasibility proof for any schedule); orders that fit
    without recomputation; the covering bound over schedules with first computations in ``T``
    and heuristic schedules (one built from the covering solution is often already optimal);
    then CP-SAT on the stage model, warm-started with the best stage-form schedule. It stops
    at the first proof of optimality; on timeout it returns the best schedule and its bounds.

    >>> chain = RematProblem(  # 0 -> 1 -> 2 -> 3, and 3 also reads 0
    ...     nodes=tuple(RematNode(i, cost=1, mem=4 if i < 3 else 1) for i in range(4)),
    ...     edges=((0, 1), (1, 2), (2, 3), (0, 3)),
    ... )
    >>> peak_without_recomputation(chain)
    12
    >>> result = solve(chain, budget=9, time_limit_s=5)
    >>> result.status.value, result.order, result.cost, result.peak
    ('optimal', [0, 1, 2, 0, 3], 5, 9)
    >>> solve(chain, budget=8).status.value  # 3 reads 0 and 2 while writing itself: 9 bytes
    'infeasible'
    """
    start = time.perf_counter()
    deadline = start + time_limit_s
    g = _indexed(problem, None)
    index = {node_id: i for i, node_id in enumerate(g.ids)}
    base = sum(g.cost)

    def answer(
        status: Status, order: list[int] | None, bound: int, order_bound: int, reason: str
    ) -> RematSchedule:
        cost = peak = gap = None
        if order is not None:
            steps = [[index[v] for v in order]]
            cost = cost_of(g, steps)
            peak = peak_of(g, steps)
            gap = max(0.0, (cost - base - bound) / cost) if cost else 0.0
        return RematSchedule(
            status=status,
            order=order or [],
            cost=cost,
            peak=peak,
            budget=budget,
            lower_bound=base + bound,
            order_bound=base + order_bound,
            gap=gap,
            solve_seconds=time.perf_counter() - start,
            total_cost=base,
            reason=reason,
        )

    floor = memory_lower_bound(problem)
    if budget < floor:
        return answer(
            Status.INFEASIBLE,
            None,
            0,
            0,
            f"budget {budget} is below the memory "
            f"lower bound {floor}: some op's output and inputs cannot fit",
        )
    if peak_of(g, [list(range(g.n))]) <= budget:
        return answer(Status.OPTIMAL, list(g.ids), 0, 0, "fits without recomputation")
    other = _indexed(problem, [g.ids[k] for k in heuristics.low_memory_order(g)])
    other_peak = peak_of(other, [list(range(other.n))])
    if other_peak <= budget:
        return answer(
            Status.OPTIMAL,
            list(other.ids),
            0,
            0,
            "fits without recomputation in another topological order",
        )

    relaxed, drops = cpsat.order_bound(g, budget, (deadline - time.perf_counter()) / 4, workers)
    quick = time.perf_counter() + max(0.0, deadline - time.perf_counter()) / 4
    best, staged = heuristics.heuristic_schedules(g, budget, drops, quick)
    found = [_ids(g, s) for s in (best, staged) if s is not None]
    if other_peak < peak_of(g, [list(range(g.n))]):
        alternative, _ = heuristics.heuristic_schedules(other, budget, set(), quick)
        if alternative is not None:
            found.append(_ids(other, alternative))

    def extra(order: list[int]) -> int:
        return cost_of(g, [[index[v] for v in order]]) - base

    def verdict(order: list[int], bound: int, proven: bool, reason: str) -> RematSchedule:
        """Status of the cheapest schedule against the T-first bound and the stage bound."""
        cost = extra(order)
        if cost == relaxed:
            return answer(
                Status.OPTIMAL,
                order,
                relaxed,
                relaxed,
                "cost equals the bound for every schedule whose first computations follow T",
            )
        if cost < relaxed:  # only a schedule over another order can do this
            return answer(
                Status.FEASIBLE,
                order,
                0,
                relaxed,
                "cheaper than every schedule "
                "whose first computations follow T; other orders are not bounded",
            )
        if cost < bound:
            return answer(
                Status.FEASIBLE,
                order,
                relaxed,
                relaxed,
                "a heuristic schedule outside the stage model beats its bound; " + reason,
            )
        if proven:
            return answer(
                Status.OPTIMAL, order, bound, relaxed, "proven optimal in the stage model"
            )
        return answer(Status.FEASIBLE, order, bound, relaxed, reason)

    if found and min(map(extra, found)) <= relaxed:
        return verdict(min(found, key=extra), relaxed, False, "")
    if cpsat.stage_model_size(g) > MAX_STAGE_MODEL_BOOLEANS:
        if not found:
            return answer(
                Status.UNKNOWN,
                None,
                relaxed,
                relaxed,
                "heuristics found no schedule; graph too large for the stage model",
            )
        return verdict(
            min(found, key=extra),
            relaxed,
            False,
            "heuristic schedule; graph too large for the stage model",
        )
    outcome = cpsat.improve(g, budget, staged, relaxed, deadline, workers)
    if outcome.stages is not None:
        found.append(_ids(g, outcome.stages))
    if found:
        return verdict(min(found, key=extra), outcome.bound, outcome.optimal, "time limit reached")
    if outcome.infeasible:
        return answer(
            Status.UNKNOWN,
            None,
            outcome.bound,
            relaxed,
            "the stage model has no schedule; other orders of first computations were not tried",
        )
    return answer(
        Status.UNKNOWN, None, outcome.bound, relaxed, "time limit reached without a schedule"
    )
