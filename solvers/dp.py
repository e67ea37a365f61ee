"""Optimal flat checkpointing of a chain: the least recompute time whose peak fits a budget.

The dynamic programme runs right to left. For the suffix of blocks from ``s`` it keeps the
Pareto frontier of ``(Q, cost)``: ``Q`` is the suffix's peak plus the savings of the blocks
before it (so the true peak is ``Q - P``), ``cost`` its recompute time. A run ``[s, e)`` placed in
front of a suffix point ``(Q', c')`` gives ``Q = max(Q' - saving(run), local peak of the run)``,
monotone in ``Q'``, so discarding dominated points keeps the answer exact. One pass yields every
plan on the memory/time frontier; the budget only picks a point of it.

Cost, with ``n`` blocks, segments of at most ``L`` blocks, ``m`` options per block (0 for
``dp``) and suffix frontiers of at most ``F`` points: ``n * L * (m + 1)`` runs, whose figures
``segment_terms`` gives in O(1) each (O(n * L * (m + 1)) in all, not O(n * L^2 * m)), and at
most ``n * L * (m + 1) * F`` candidate points, sorted per stage. ``F`` grows with the plans
the blocks allow: on the Llama-2-70B shape (80 blocks, 32 options) the unbounded frontier
holds thousands of points per stage and 151 million candidates in all. ``solve`` needs one
budget's optimum only, so it passes a ``Bound``: a point none of whose completions fits the
budget, or can beat a plan known to fit (``ckptplan.solvers.bounds``), is never made, each
run's usable slice of its suffix found by bisection. That pruning is exact (the optimum and
every point on its way survive); on that shape it leaves a few hundred points per stage
and solves ``auto`` in seconds where the whole frontier took minutes.

Example:
    >>> from ckptplan.solvers.chain import Chain, ChainBlock
    >>> blocks = tuple(ChainBlock(f"b{i}", 1.0, 10, 30, True, 100 + 40 * i, 150 + 40 * i, 20,
    ...                           140 + 40 * i, 170 + 40 * i) for i in range(4))
    >>> plan = solve(Chain(blocks, tail_peaks=((280, "loss"),)), budget=230)
    >>> plan.peak <= 230, plan.recompute_time
    (True, 2.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ckptplan.solvers.bounds import Prefix, prefixes
from ckptplan.solvers.chain import (
    Chain,
    InfeasibleBudget,
    RunTerms,
    Schedule,
    Segment,
    nested_terms,
    run_terms,
    simulate,
)
from ckptplan.solvers.segments import segment_terms

_Run = tuple[int, int, bool, int | None, int | None]
"""(start, end, checkpointed, the option every block of the run takes or None, the enclosure
checkpointed nested or None)."""


@dataclass(frozen=True)
class Bound:
    """What a solve for one budget may prune: points whose completions all peak over
    ``budget``, or all recompute longer than ``time``, the recompute time of a plan known to
    fit (see ``ckptplan.solvers.bounds``). Exact: the optimum under ``budget`` survives."""

    budget: int
    time: float = math.inf


@dataclass(frozen=True)
class _Stage:
    """The suffix frontier from one block: ``q`` rising, ``cost`` falling, and for each point
    the run that starts it and the index of the point it continues in the run's end stage."""

    q: np.ndarray
    cost: np.ndarray
    back: list[tuple[_Run, int] | None]
    negated: np.ndarray
    """``-cost``, rising, to bisect on."""

    @staticmethod
    def of(q: list[float], cost: list[float], back: list[tuple[_Run, int] | None]) -> _Stage:
        costs = np.array(cost, dtype=float)
        return _Stage(np.array(q, dtype=float), costs, back, -costs)


def _runs(chain: Chain, s: int, longest: int, selective: bool) -> list[_Run]:
    """Every run a plan may start at block ``s``."""
    n = len(chain.blocks)
    runs: list[_Run] = [(s, s + 1, False, None, None)]
    runs.extend((s, c.end, True, None, k) for k, c in enumerate(chain.enclosures) if c.start == s)
    shared = len(chain.blocks[s].options) if selective else 0
    for e in range(s + 1, min(n, s + longest) + 1):
        if e > s + 1 and not chain.blocks[e - 1].joins_previous:
            break
        shared = min(shared, len(chain.blocks[e - 1].options))
        runs.append((s, e, True, None, None))
        runs.extend((s, e, True, i, None) for i in range(shared))
    return runs


def _figures(
    chain: Chain, s: int, longest: int, selective: bool
) -> dict[_Run, tuple[float, int, float]]:
    """(local peak, saving, recompute time) of every run from block ``s``: segments by
    ``segment_terms``, O(1) each, the rest by their terms."""
    out: dict[_Run, tuple[float, int, float]] = {}
    options = len(chain.blocks[s].options) if selective else 0
    for option in (None, *range(options)):
        for end, local, saving, time in segment_terms(chain, s, option, longest):
            out[(s, end, True, option, None)] = (local, saving, time)
    for run in _runs(chain, s, longest, selective):
        if run not in out:
            terms = _terms(chain, run)
            out[run] = (terms.local_peak()[0], terms.saving, terms.recompute_time)
    return out


def _stages(
    chain: Chain, max_segment: int | None, selective: bool, bound: Bound | None
) -> list[_Stage]:
    """The suffix frontiers, right to left (see the module docstring)."""
    n = len(chain.blocks)
    tail = max((v for v, _ in chain.tail_peaks), default=0)
    stages: list[_Stage] = [_Stage.of([], [], []) for _ in range(n)]
    stages.append(_Stage.of([float(tail)], [0.0], [None]))
    longest = n if max_segment is None else max_segment
    befores = prefixes(chain, selective) if bound else []
    limit = bound.time * (1 + 1e-9) + 1e-12 if bound else math.inf
    for s in range(n - 1, -1, -1):
        runs = _runs(chain, s, longest, selective)
        before = befores[s] if bound else None
        top = bound.budget + before.most_saving if bound and before is not None else math.inf
        figures = _figures(chain, s, longest, selective)
        pieces: list[tuple[np.ndarray, ...]] = []
        for index, run in enumerate(runs):
            rest = stages[run[1]]
            local, saving, time = figures[run]
            if not len(rest.q) or local > top:
                continue
            # Points that fall below the run's own peak all become it: the cheapest is last.
            lo = max(0, int(np.searchsorted(rest.q, local + saving, "right")) - 1)
            hi = len(rest.q)
            if bound and before is not None:
                # What the blocks before must spend bounds both ends: its least, to save what
                # the run's own peak asks, and the most it can save in the time left.
                spare = limit - time - before.least_time(local - bound.budget)
                lo = max(lo, int(np.searchsorted(rest.negated, -spare, "left")))
                most = before.most_saving_within(limit - time - rest.cost[-1])
                hi = int(np.searchsorted(rest.q, bound.budget + most + saving, "right"))
            if lo < hi:
                pieces.append(
                    (
                        np.maximum(rest.q[lo:hi] - saving, local),
                        rest.cost[lo:hi] + time,
                        np.full(hi - lo, index),
                        np.arange(lo, hi),
                    )
                )
        stages[s] = _frontier_of(pieces, runs, before, bound, limit)
    return stages


def _frontier_of(
    pieces: list[tuple[np.ndarray, ...]],
    runs: list[_Run],
    before: Prefix | None,
    bound: Bound | None,
    limit: float,
) -> _Stage:
    """The Pareto frontier of a stage's candidate points, ``pieces`` of ``(q, cost, run index,
    point index)`` arrays: sorted by ``q`` then cost, each point kept where it is cheaper than
    every point before it (by more than rounding), and, with a ``bound``, where the blocks
    before can still complete it within ``limit``.

    Note [sorting candidates in bulk]
        A stage's candidates outnumber its frontier a hundredfold: on the Llama-2-70B shape
        with 31 selective options per block, 22.6 million candidates for 259 thousand frontier
        points. So the candidates are made and sorted as arrays, and only the points cheaper
        than all before them, a superset of the frontier (a point the sweep keeps is cheaper
        than every point before it), go through the sweep one by one. The order and the sweep
        are those of sorting ``(q, cost, run, point)`` tuples, so the frontier is the same.
    """
    if not pieces:
        return _Stage.of([], [], [])
    q, cost, index, point = (np.concatenate(column) for column in zip(*pieces, strict=True))
    order = np.lexsort((cost, q))  # stable: ties keep the pieces' order, by run then point
    cost = cost[order]
    cheaper = cost < np.concatenate(([math.inf], np.minimum.accumulate(cost)[:-1]))
    keep = order[cheaper]
    out_q: list[float] = []
    out_cost: list[float] = []
    back: list[tuple[_Run, int] | None] = []
    best = math.inf
    for q_k, cost_k, index_k, point_k in zip(
        q[keep].tolist(),
        cost[cheaper].tolist(),
        index[keep].tolist(),
        point[keep].tolist(),
        strict=True,
    ):
        if cost_k < best - 1e-12:
            best = cost_k
            if (
                bound
                and before is not None
                and cost_k + before.least_time(q_k - bound.budget) > limit
            ):
                continue
            out_q.append(q_k)
            out_cost.append(cost_k)
            back.append((runs[index_k], point_k))
    return _Stage.of(out_q, out_cost, back)


def _plan(
    stages: list[_Stage], index: int
) -> tuple[list[Segment], list[tuple[int, int]], list[int]]:
    """Segments, (block, option) pairs and nested enclosures of point ``index`` of stage 0."""
    segments: list[Segment] = []
    options: list[tuple[int, int]] = []
    nested: list[int] = []
    back = stages[0].back[index]
    while back is not None:
        (start, end, checkpointed, option, enclosure), index = back
        if enclosure is not None:
            nested.append(enclosure)
        elif checkpointed:
            segments.append((start, end))
        if option is not None:
            options.extend((k, option) for k in range(start, end))
        back = stages[end].back[index]
    return segments, options, nested


def frontier(
    chain: Chain,
    max_segment: int | None = None,
    selective: bool = False,
    name: str = "dp",
    bound: Bound | None = None,
) -> list[Schedule]:
    """Every Pareto-optimal plan of the chain, from the fastest to the smallest.

    With ``selective``, the blocks of a segment may also take selective options (keep some op
    outputs, recompute the rest): any option of a block checkpointed on its own, or the same
    option index in every block of a longer segment (repeated layers share one menu, so that
    is one policy for all of them, the shape of the op-level optimum on uniform chains).
    The chain's enclosures may also be checkpointed whole, nested (see ``Enclosure``).
    With ``bound``, only the plans that may be optimal under its budget (see ``Bound``).
    """
    stages = _stages(chain, max_segment, selective, bound)
    best: dict[int, Schedule] = {}
    for index in range(len(stages[0].q)):
        segments, options, nested = _plan(stages, index)
        plan = simulate(chain, segments, name, options, nested)
        if plan.peak not in best or plan.recompute_time < best[plan.peak].recompute_time:
            best[plan.peak] = plan
    return sorted(best.values(), key=lambda p: p.recompute_time)


def _terms(chain: Chain, run: _Run) -> RunTerms:
    start, end, checkpointed, option, enclosure = run
    if enclosure is not None:
        return nested_terms(chain, enclosure)
    picks = [None if option is None else b.options[option] for b in chain.blocks[start:end]]
    return run_terms(chain, start, end, checkpointed, picks if checkpointed else ())


def solve(
    chain: Chain,
    budget: int,
    max_segment: int | None = None,
    selective: bool = False,
    name: str = "dp",
) -> Schedule:
    """The plan of least recompute time with predicted peak <= ``budget``.

    The frontier is bounded by the budget and, with ``selective``, by the time of a plan
    known to fit: the best of segments alone, then the best of selective blocks each in a
    segment of its own (see ``Bound``; both are plans of the full search, so it stays exact).
    Raises ``InfeasibleBudget`` (with the least reachable peak) when no plan fits.
    """
    incumbent = math.inf
    if selective:
        incumbent = _fastest(frontier(chain, max_segment, False, name, Bound(budget)), budget)
        if max_segment != 1:
            singles = frontier(chain, 1, True, name, Bound(budget, incumbent))
            incumbent = min(incumbent, _fastest(singles, budget))
    plans = frontier(chain, max_segment, selective, name, Bound(budget, incumbent))
    fitting = [p for p in plans if p.peak <= budget]
    if not fitting:
        raise InfeasibleBudget(budget, least_peak(chain, max_segment, selective))
    best = min(fitting, key=lambda p: (p.recompute_time, p.peak))
    return replace(best, optimal=True)


def _fastest(plans: list[Schedule], budget: int) -> float:
    """The least recompute time of the ``plans`` that fit ``budget`` (inf: none)."""
    return min((p.recompute_time for p in plans if p.peak <= budget), default=math.inf)


def least_peak(chain: Chain, max_segment: int | None = None, selective: bool = False) -> int:
    """The least predicted peak of any plan: the DP keeping one point per stage, its least
    ``Q`` (a run's ``Q`` is monotone in its suffix's, so the least composes)."""
    n = len(chain.blocks)
    longest = n if max_segment is None else max_segment
    tail = float(max((v for v, _ in chain.tail_peaks), default=0))
    stages = [_Stage.of([], [], []) for _ in range(n)]
    stages.append(_Stage.of([tail], [0.0], [None]))
    for s in range(n - 1, -1, -1):
        least: tuple[float, _Run] | None = None
        for run in _runs(chain, s, longest, selective):
            terms = _terms(chain, run)
            q = max(stages[run[1]].q[0] - terms.saving, terms.local_peak()[0])
            if least is None or q < least[0]:
                least = (q, run)
        assert least is not None
        stages[s] = _Stage.of([least[0]], [0.0], [(least[1], 0)])
    segments, options, nested = _plan(stages, 0)
    return simulate(chain, segments, "least", options, nested).peak
