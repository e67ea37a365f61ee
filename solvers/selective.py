"""Selective checkpointing of one block: which op outputs to keep, offload or recompute.

Under a selective policy, a checkpointed block keeps its input plus the outputs of the ops
marked *save*; an op marked *offload* has its output copied to host memory in forward and
back in backward; every other op of the block's forward runs again. An output not kept costs
the cheaper of its recompute and its round trip to host, and no device memory between
forward and backward. So keeping an op buys back that cost at the price of its output bytes,
independently of the other ops: the best choices for every memory size form the Pareto
frontier of a 0/1 knapsack, which a dynamic programme over the ops finds exactly. Ops that must
share one decision (the random ops of a block, whose outputs are kept or regenerated
together) come as one item.

Example:
    >>> items = [SaveItem(("mm#0",), 40, 5.0), SaveItem(("gelu#0",), 40, 0.5),
    ...          SaveItem(("mm#1",), 10, 5.0, offload_time=2.0)]
    >>> [(s.kept_bytes, s.recompute_time, s.offloaded) for s in frontier(items)]
    [(0, 7.5, ('mm#1',)), (10, 5.5, ()), (40, 2.5, ('mm#1',)), (50, 0.5, ()), (90, 0.0, ())]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class SaveItem:
    """One decision: keep these ops' outputs (``output_bytes``), recompute them (``time``) or,
    where ``offload_time`` is given, move them to host memory and back."""

    ops: tuple[str, ...]
    output_bytes: int
    time: float
    offload_time: float | None = None

    @property
    def drop_cost(self) -> float:
        """What not keeping the outputs costs: the cheaper of recompute and offload."""
        if self.offload_time is None:
            return self.time
        return min(self.time, self.offload_time)

    @property
    def offloads(self) -> bool:
        return self.offload_time is not None and self.offload_time < self.time


@dataclass(frozen=True)
class Selection:
    """A point of the frontier: the ops kept, the ops offloaded, the bytes kept on the device,
    and the time spent recomputing and moving what is not kept."""

    saved: tuple[str, ...]
    kept_bytes: int
    recompute_time: float
    offloaded: tuple[str, ...] = ()
    offloaded_bytes: int = 0


EXACT_POINTS = 4096
"""Frontiers up to this many points are kept exact while they are built."""


def frontier(
    items: Sequence[SaveItem], max_points: int | None = None, tolerance: float = 0.0
) -> list[Selection]:
    """Every Pareto-optimal selection, from keeping nothing to keeping everything useful.

    ``tolerance`` > 0 thins the frontier while it is built, once it holds more than
    ``EXACT_POINTS`` points: see Note [thinning the knapsack as it is built]. ``max_points``
    then thins the result evenly over memory (the end points are always kept), so a chain
    solver gets a short menu per block.

    Time O(k * P) for ``k`` items and at most ``P`` points per step: P is bounded by the
    distinct sums of kept bytes (exponential in k where times are proportional to bytes, as
    for a block of pointwise ops), and with ``tolerance`` by max(EXACT_POINTS, k / tolerance + 2).
    """
    paying = [item for item in items if item.drop_cost > 0]
    total = sum(item.drop_cost for item in items)
    step = tolerance * total / len(paying) if paying else 0.0
    points: dict[int, tuple[float, tuple[int, ...]]] = {0: (0.0, ())}
    for index, item in enumerate(items):
        if item.drop_cost <= 0:
            continue
        grown = dict(points)
        for kept, (gained, chosen) in points.items():
            candidate = (kept + item.output_bytes, gained + item.drop_cost)
            best = grown.get(candidate[0])
            if best is None or best[0] < candidate[1]:
                grown[candidate[0]] = (candidate[1], (*chosen, index))
        points = _pareto(grown, step if len(grown) > EXACT_POINTS else 0.0)
    selections = [
        _selection(items, set(chosen), kept, max(0.0, total - gained))
        for kept, (gained, chosen) in sorted(points.items())
    ]
    return thin(selections, max_points) if max_points else selections


# Note [thinning the knapsack as it is built]
#     A block of a few hundred ops whose times are proportional to their bytes (a Swin stage
#     taken whole) has a Pareto frontier of hundreds of thousands of points: nearly every sum
#     of kept bytes buys its own time. With ``tolerance`` t, once a step's frontier exceeds
#     ``EXACT_POINTS``, a point is dropped when one of no more bytes, kept already, gains no
#     more than ``d = t * T / k`` less time (T the time of keeping nothing, k the items that
#     cost anything). A covering point composes with later items as the point it covers did,
#     so the losses of the k steps add: every selection of the exact frontier has one in the
#     thinned frontier of no more bytes and at most ``t * T`` more recompute time. Each step
#     keeps at most T / d + 2 = k / t + 2 points. ``tests/test_solve_scale.py`` checks the
#     bound against the exact frontier.


def _selection(items: Sequence[SaveItem], kept: set[int], size: int, cost: float) -> Selection:
    moved = [item for i, item in enumerate(items) if i not in kept and item.offloads]
    return Selection(
        saved=tuple(op for i in sorted(kept) for op in items[i].ops),
        kept_bytes=size,
        recompute_time=cost,
        offloaded=tuple(op for item in moved for op in item.ops),
        offloaded_bytes=sum(item.output_bytes for item in moved),
    )


def _pareto(
    points: dict[int, tuple[float, tuple[int, ...]]], step: float = 0.0
) -> dict[int, tuple[float, tuple[int, ...]]]:
    """The points no other point beats on both bytes and time gained; with ``step``, also
    those that gain less than ``step`` more than the last point kept (the largest is kept)."""
    kept: dict[int, tuple[float, tuple[int, ...]]] = {}
    best = -1.0
    last = None
    for size in sorted(points):
        gained = points[size][0]
        if gained > best + 1e-15:
            last = size
            if gained > best + step or not kept:
                kept[size] = points[size]
                best = gained
    if last is not None:
        kept[last] = points[last]
    return kept


@dataclass(frozen=True)
class Combination:
    """One option per menu (``choice[i]`` indexes menu ``i``), their bytes and time summed."""

    choice: tuple[int, ...]
    kept_bytes: int
    recompute_time: float


def combinations(menus: Sequence[Sequence[Selection]], max_points: int = 4096) -> list[Combination]:
    """The Pareto frontier of taking one option from every menu (a multiple-choice knapsack),
    bytes rising and time falling. Beyond ``max_points`` sums, bytes are bucketed upward
    (a sum is never understated) so each step holds at most ``max_points`` points. Of equal
    sums, the one keeping more in later menus is taken: in a chain, a later block's backward
    runs nearer the step's peak, where what it keeps spares rebuilding.

    Example: two blocks, each keeping nothing (10 s) or 4 bytes (1 s) or 8 bytes (0 s).

        >>> menu = [Selection((), 0, 10.0), Selection(("a",), 4, 1.0), Selection(("b",), 8, 0.0)]
        >>> [(c.choice, c.kept_bytes) for c in combinations([menu, menu])]
        [((0, 0), 0), ((0, 1), 4), ((1, 1), 8), ((1, 2), 12), ((2, 2), 16)]
        >>> [c.recompute_time for c in combinations([menu, menu])]
        [20.0, 11.0, 2.0, 1.0, 0.0]
    """
    widest = sum(max((o.kept_bytes for o in menu), default=0) for menu in menus)
    quantum = max(1, -(-widest // max_points))
    points: dict[int, Combination] = {0: Combination((), 0, 0.0)}
    for menu in menus:
        grown: dict[int, Combination] = {}
        for point in points.values():
            for i, option in enumerate(menu):
                size = point.kept_bytes + option.kept_bytes
                bucket = -(-size // quantum)
                time = point.recompute_time + option.recompute_time
                held = grown.get(bucket)
                if held is None or time < held.recompute_time:
                    grown[bucket] = Combination((*point.choice, i), size, time)
        points = {}
        best = math.inf
        for bucket in sorted(grown):
            if grown[bucket].recompute_time < best:
                points[bucket] = grown[bucket]
                best = grown[bucket].recompute_time
    return [points[bucket] for bucket in sorted(points)]


def thin(points: Sequence[T], max_points: int) -> list[T]:
    """At most ``max_points`` of ``points``, evenly spaced, the first and last always kept."""
    if len(points) <= max_points:
        return list(points)
    step = (len(points) - 1) / (max_points - 1)
    picks = sorted({round(i * step) for i in range(max_points)})
    return [points[i] for i in picks]
