"""Lower bounds on what the blocks before a point of the chain DP must spend.

A point of the DP's suffix frontier at block ``s`` has value ``Q``: the plan's peak is ``Q - P``
with ``P`` the savings of the checkpointed runs before ``s``. Under a budget ``B`` a completion
must save ``P >= Q - B`` in blocks ``[0, s)``, and saving costs recompute time. Relaxed to a
fractional knapsack (each block takes any convex mix of its choices: unchecked, plain
checkpoint, each selective option, its share of a nested enclosure), the least time to save
``X`` bytes is a convex piecewise-linear function ``Prefix.least_time(X)``; no plan of the
prefix saves more than ``Prefix.most_saving``. Both are bounds, never estimates: a point whose
time plus that bound exceeds the time of a plan known to fit cannot lead to the optimum.

Example:
    >>> from ckptplan.solvers.chain import Chain, ChainBlock
    >>> blocks = tuple(ChainBlock(f"b{i}", 1.0, 10, 30, True, 100, 150, 20, 140, 170)
    ...                for i in range(4))
    >>> prefix = prefixes(Chain(blocks), selective=False)[2]
    >>> prefix.most_saving, prefix.least_time(40), prefix.least_time(100)
    (80.0, 1.0, inf)
    >>> prefix.most_saving_within(1.5)
    60.0
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass

from ckptplan.solvers.chain import Chain, block_saving, nested_terms


@dataclass(frozen=True)
class Prefix:
    """The blocks before one point: their pooled hull segments, cheapest bytes first."""

    widths: tuple[float, ...]
    """Cumulative bytes saved at the end of each segment."""
    times: tuple[float, ...]
    """Cumulative time at the end of each segment."""
    slopes: tuple[float, ...]

    @property
    def most_saving(self) -> float:
        return self.widths[-1] if self.widths else 0

    def least_time(self, saving: float) -> float:
        """The least recompute time in which these blocks save ``saving`` bytes (inf: never)."""
        if saving <= 0:
            return 0.0
        i = bisect.bisect_left(self.widths, saving)
        if i == len(self.widths):
            return float("inf")
        before_w = self.widths[i - 1] if i else 0
        before_t = self.times[i - 1] if i else 0.0
        return before_t + (saving - before_w) * self.slopes[i]

    def most_saving_within(self, time: float) -> float:
        """The most bytes these blocks save in ``time`` of recompute (the inverse bound)."""
        if time < 0:
            return -math.inf
        i = bisect.bisect_right(self.times, time)
        if i == len(self.times):
            return self.most_saving
        before_w = self.widths[i - 1] if i else 0
        before_t = self.times[i - 1] if i else 0.0
        return before_w + (time - before_t) / self.slopes[i]


def _choices(chain: Chain, selective: bool) -> list[list[tuple[float, float]]]:
    """Per block, (most bytes saved, least time) of each way it may be checkpointed."""
    out: list[list[tuple[float, float]]] = []
    for b in chain.blocks:
        most = block_saving(b, False) + b.freed_output_bytes  # at most: it may end a segment
        points: list[tuple[float, float]] = [(most, max(0.0, b.fwd_time - b.tail_time))]
        if selective:
            points += [
                (
                    most - o.kept_bytes + (b.output_bytes if o.keeps_output else 0),
                    max(0.0, o.recompute_time - max(0.0, o.tail_time)),
                )
                for o in b.options
            ]
        out.append(points)
    for k, enclosure in enumerate(chain.enclosures):
        members = range(enclosure.start, enclosure.end)
        after = enclosure.after.saved_bytes if enclosure.after else 0
        saving = sum(block_saving(chain.blocks[i], False) for i in members) + after
        time = nested_terms(chain, k).recompute_time
        for i in members:
            out[i].append((saving / len(members), max(0.0, time) / len(members)))
    return out


def _hull(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(width, slope) of the lower convex hull from (0, 0) over ``points``, slopes rising.

    A choice that saves less for no less time than another is dropped first, so what is left
    rises in time with its saving and every slope is positive.
    """
    useful: list[tuple[float, float]] = []
    for saving, time in sorted(points, key=lambda p: (-p[0], p[1])):
        if saving > 0 and (not useful or time < useful[-1][1]):
            useful.append((saving, time))
    hull: list[tuple[float, float]] = [(0.0, 0.0)]
    for point in reversed(useful):
        while len(hull) > 1 and _cross(hull[-2], hull[-1], point) <= 0:
            hull.pop()
        hull.append(point)
    return [
        (w1 - w0, max(0.0, (t1 - t0) / (w1 - w0)))
        for (w0, t0), (w1, t1) in itertools.pairwise(hull)
    ]


def _cross(o: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def prefixes(chain: Chain, selective: bool) -> list[Prefix]:
    """``Prefix`` of blocks ``[0, s)`` for every ``s`` from 0 to the chain's length.

    O(n * h * log(n * h)) per prefix with h hull segments per block; identical blocks give
    identical hulls, pooled by slope, so a prefix holds at most one entry per distinct slope.
    """
    pooled: dict[float, float] = {}
    out = [Prefix((), (), ())]
    for choices in _choices(chain, selective):
        for width, slope in _hull(choices):
            pooled[slope] = pooled.get(slope, 0.0) + width
        slopes = sorted(pooled)
        widths = list(itertools.accumulate(pooled[s] for s in slopes))
        times = list(itertools.accumulate(pooled[s] * s for s in slopes))
        out.append(Prefix(tuple(widths), tuple(times), tuple(slopes)))
    return out
