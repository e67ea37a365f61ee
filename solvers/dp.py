"""Optimal flat checkpointing of a chain: the least recompute time whose peak fits a budget.

The dynamic programme runs right to left. For the suffix of blocks from ``s`` it keeps the
Pareto frontier of ``(Q, cost)``: ``Q`` is the suffix's peak plus the savings of the blocks
before it (so the true peak is ``Q - P``), ``cost`` its recompute time. A run ``[s, e)`` placed in
front of a suffix point ``(Q', c')`` gives ``Q = max(Q' - saving(run), local peak of the run)``,
monotone in ``Q'``, so discarding dominated points keeps the answer exact. One pass yields every
plan on the memory/time frontier; the budget only picks a point of it.

Example:
    >>> from ckptplan.solvers.chain import Chain, ChainBlock
    >>> blocks = tuple(ChainBlock(f"b{i}", 1.0, 10, 30, True, 100 + 40 * i, 150 + 40 * i, 20,
    ...                           140 + 40 * i, 170 + 40 * i) for i in range(4))
    >>> plan = solve(Chain(blocks, tail_peaks=((280, "loss"),)), budget=230)
    >>> plan.peak <= 230, plan.recompute_time
    (True, 2.0)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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

_Run = tuple[int, int, bool, int | None, int | None]
"""(start, end, checkpointed, the option every block of the run takes or None, the enclosure
checkpointed nested or None)."""


@dataclass(frozen=True)
class _Point:
    q: float
    cost: float
    run: _Run | None
    rest: _Point | None

    def plan(self) -> tuple[list[Segment], list[tuple[int, int]], list[int]]:
        segments: list[Segment] = []
        options: list[tuple[int, int]] = []
        nested: list[int] = []
        point: _Point | None = self
        while point is not None and point.run is not None:
            start, end, checkpointed, option, enclosure = point.run
            if enclosure is not None:
                nested.append(enclosure)
            elif checkpointed:
                segments.append((start, end))
            if option is not None:
                options.extend((k, option) for k in range(start, end))
            point = point.rest
        return segments, options, nested


def _pareto(points: list[_Point]) -> list[_Point]:
    points.sort(key=lambda p: (p.q, p.cost))
    kept: list[_Point] = []
    for p in points:
        if not kept or p.cost < kept[-1].cost - 1e-12:
            kept.append(p)
    return kept


def frontier(
    chain: Chain, max_segment: int | None = None, selective: bool = False, name: str = "dp"
) -> list[Schedule]:
    """Every Pareto-optimal plan of the chain, from the fastest to the smallest.

    With ``selective``, the blocks of a segment may also take selective options (keep some op
    outputs, recompute the rest): any option of a block checkpointed on its own, or the same
    option index in every block of a longer segment (repeated layers share one menu, so that
    is one policy for all of them, the shape of the op-level optimum on uniform chains).
    The chain's enclosures may also be checkpointed whole, nested (see ``Enclosure``).
    """
    n = len(chain.blocks)
    tail = max((v for v, _ in chain.tail_peaks), default=0)
    suffix: list[list[_Point]] = [[] for _ in range(n + 1)]
    suffix[n] = [_Point(float(tail), 0.0, None, None)]
    longest = n if max_segment is None else max_segment
    for s in range(n - 1, -1, -1):
        candidates: list[_Point] = []
        runs: list[_Run] = [(s, s + 1, False, None, None)]
        runs.extend(
            (s, c.end, True, None, k) for k, c in enumerate(chain.enclosures) if c.start == s
        )
        shared = len(chain.blocks[s].options) if selective else 0
        for e in range(s + 1, min(n, s + longest) + 1):
            if e > s + 1 and not chain.blocks[e - 1].joins_previous:
                break
            shared = min(shared, len(chain.blocks[e - 1].options))
            runs.append((s, e, True, None, None))
            runs.extend((s, e, True, i, None) for i in range(shared))
        for run in runs:
            terms = _terms(chain, run)
            end = run[1]
            local = terms.local_peak()[0]
            for rest in suffix[end]:
                q = max(rest.q - terms.saving, local)
                candidates.append(_Point(q, rest.cost + terms.recompute_time, run, rest))
        suffix[s] = _pareto(candidates)
    best: dict[int, Schedule] = {}
    for point in suffix[0]:
        segments, options, nested = point.plan()
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

    Raises ``InfeasibleBudget`` (with the least reachable peak) when no plan fits.
    """
    plans = frontier(chain, max_segment, selective, name)
    fitting = [p for p in plans if p.peak <= budget]
    if not fitting:
        raise InfeasibleBudget(budget, min(p.peak for p in plans))
    best = min(fitting, key=lambda p: (p.recompute_time, p.peak))
    return replace(best, optimal=True)
