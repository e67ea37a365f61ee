"""What steps timed in pairs tell: the median of their ratios, its spread, and how sure it is
(Note [how sure a measured overhead is]). Plain numbers, no torch: ``compile.py`` times the
pairs, this reads them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def paired(mine: Sequence[float], theirs: Sequence[float]) -> tuple[float, list[float]]:
    """The median and quartiles of the per-round time ratios ``mine / theirs``: the two ran
    next to each other in every round, so drift in the machine's speed divides out.

    >>> paired([2.0, 3.0, 4.0, 5.0], [2.0, 2.0, 2.0, 2.0])
    (1.75, [1.125, 2.375])
    """
    return spread([a / b for a, b in zip(mine, theirs, strict=True)])


def spread(ratios: Sequence[float]) -> tuple[float, list[float]]:
    """The median and quartiles of ``ratios``, to four places.

    >>> spread([1.0, 1.5, 2.0, 2.5])
    (1.75, [1.125, 2.375])
    """
    quartiles = statistics.quantiles(ratios, n=4)
    return round(statistics.median(ratios), 4), [round(quartiles[0], 4), round(quartiles[2], 4)]


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """An interval that holds the median of the distribution ``values`` were drawn from with
    at least ``confidence``, whatever that distribution: the order statistics a binomial tail
    picks (the whole range where there are too few values for that confidence).

    >>> median_interval(range(1, 65))  # 64 pairs: the 24th and 41st of them
    (24, 41)
    >>> median_interval([3.0, 1.0, 2.0])
    (1.0, 3.0)
    """
    ordered = sorted(values)
    n = len(ordered)
    tail, rank = 0.0, 0
    while rank < n and tail + math.comb(n, rank) / 2**n <= (1 - confidence) / 2:
        tail += math.comb(n, rank) / 2**n
        rank += 1
    if rank == 0:
        return ordered[0], ordered[-1]
    return ordered[rank - 1], ordered[n - rank]


def overhead_check(ratios: Sequence[float], predicted: float) -> dict[str, object]:
    """A predicted overhead held to the one ``ratios`` (a plan's step over the unchecked
    step's, pair by pair) measured: the median less one, the quartiles and the 95% interval
    of the median, whether the prediction is within 25% of the median (relative), within the
    quartiles, within the interval, and whether the 25% test can tell at all: the band
    around the median is no narrower than the interval's wider half (Note [how sure a
    measured overhead is]).

    >>> check = overhead_check([1.02, 1.03, 1.04, 1.05, 1.06], predicted=0.035)
    >>> check["measured_overhead"], check["prediction_within_25_percent"]
    (0.04, True)
    >>> check["within_25_percent_decidable"]  # five pairs: the interval is their whole range
    False
    """
    median = statistics.median(ratios) - 1
    low, _, high = (q - 1 for q in statistics.quantiles(ratios, n=4))
    bottom, top = (r - 1 for r in median_interval(ratios))
    return dict(
        measured_overhead=round(median, 4),
        measured_overhead_quartiles=[round(low, 4), round(high, 4)],
        measured_overhead_interval95=[round(bottom, 4), round(top, 4)],
        prediction_within_25_percent=abs(predicted - median) <= 0.25 * abs(median),
        prediction_within_quartiles=low <= predicted <= high,
        prediction_within_interval95=bottom <= predicted <= top,
        within_25_percent_decidable=0.25 * abs(median) >= max(median - bottom, top - median),
    )


# Note [how sure a measured overhead is]
#     A plan's measured overhead is the median of its step's ratio to the unchecked step's
#     over back-to-back pairs (Note [noise in the verdicts] in ``compile.py``). Where the
#     overhead is a point or two, as for compiled plans that recompute what inductor fuses,
#     the pairs' own spread is as large as the overhead (quartiles three to four points
#     apart on one CPU thread), so the median is known to about a point: 64 pairs put the
#     true median between their 24th and 41st ratios with 95% confidence, whatever the
#     ratios' distribution. A prediction within 25% of a 1.5% overhead must land within 0.4
#     points of it, which that interval cannot confirm or refute; so each measured overhead
#     says whether its 25% test is decidable, and whether the prediction falls inside the
#     interval, which is the strongest claim the measurement supports. The interval covers
#     one run's noise, not the host's: three quiet runs of the same HF ViT plan measured
#     -3.0%, -1.5% and -1.7%, the last with the interval -2.5..-0.9, while the unchecked step
#     itself took 0.70, 0.51 and 0.54 s (``compile.json`` records the processor per run).
