"""Joined compiled regions' search, torch-free: the frontier of one option per block and the
search along it on fake-run peaks (``ckptplan.planning.joined``)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptplan.planning.joined import FAKE_RUNS, fastest_fitting
from ckptplan.solvers.selective import Combination, Selection, combinations

pytestmark = pytest.mark.torchfree

menus_strategy = st.lists(
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 50)), min_size=1, max_size=4),
    min_size=1,
    max_size=4,
)


def as_menu(raw: list[tuple[int, int]]) -> list[Selection]:
    return [Selection((f"op{i}",), size, float(time)) for i, (size, time) in enumerate(raw)]


@settings(max_examples=80, deadline=None)
@given(menus_strategy, st.integers(0, 160))
def test_combinations_hold_the_least_time_for_every_allowance(raw, allowance) -> None:
    """Against every combination, tried one by one: the frontier's fastest within the
    allowance is the least time any combination within it takes, and its sums are its
    choice's."""
    menus = [as_menu(m) for m in raw]
    front = combinations(menus)
    for point in front:
        chosen = [menus[i][o] for i, o in enumerate(point.choice)]
        assert point.kept_bytes == sum(o.kept_bytes for o in chosen)
        assert point.recompute_time == sum(o.recompute_time for o in chosen)
    best = min(
        (
            sum(o.recompute_time for o in combo)
            for combo in itertools.product(*menus)
            if sum(o.kept_bytes for o in combo) <= allowance
        ),
        default=None,
    )
    fitting = [p.recompute_time for p in front if p.kept_bytes <= allowance]
    assert (min(fitting) if fitting else None) == best
    assert [p.kept_bytes for p in front] == sorted({p.kept_bytes for p in front})
    assert all(a.recompute_time > b.recompute_time for a, b in itertools.pairwise(front))


def test_combinations_bucket_bytes_upward_beyond_the_cap() -> None:
    menu = [Selection((), 0, 9.0)] + [Selection((f"op{i}",), 1000 + i, 8.0 - i) for i in range(8)]
    front = combinations([menu] * 6, max_points=16)
    assert len(front) <= 16 + 1
    exact = combinations([menu] * 6)
    for point in front:  # never cheaper than the exact frontier at its bytes
        assert point.recompute_time >= min(
            e.recompute_time for e in exact if e.kept_bytes <= point.kept_bytes
        )


def frontier_of(sizes: list[int]) -> list[Combination]:
    return [Combination((i,), size, float(len(sizes) - i)) for i, size in enumerate(sizes)]


@pytest.mark.parametrize("jump", [0, 3, 12])
def test_the_search_finds_the_fastest_within_the_aim_in_few_runs(jump: int) -> None:
    """Peaks are the kept bytes plus an offset that grows by ``jump`` past the middle; the
    search returns the last combination within the aim, trying each at most once."""
    front = frontier_of(list(range(0, 200, 10)))
    tried: list[int] = []

    def peak_of(i: int) -> int:
        tried.append(i)
        return 50 + front[i].kept_bytes + (jump if i >= 10 else 0)

    aim = 50 + 125
    want = max(i for i in range(len(front)) if peak_of(i) <= aim)
    tried.clear()
    assert fastest_fitting(front, aim, peak_of) == want
    assert len(tried) == len(set(tried)) <= FAKE_RUNS


def test_the_search_gives_none_when_the_leanest_is_over() -> None:
    tried: list[int] = []
    front = frontier_of([0, 10, 20])
    assert fastest_fitting(front, 40, lambda i: tried.append(i) or 100) is None
    assert tried == [0]
