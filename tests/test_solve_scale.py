"""The bounded chain DP is the exact one, only faster: segment figures computed incrementally,
the frontier cut by the budget and by a plan known to fit, the least peak by its own pass."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptplan.solvers import dp, selective
from ckptplan.solvers.baselines import none
from ckptplan.solvers.bounds import prefixes
from ckptplan.solvers.chain import (
    BlockOption,
    Chain,
    InfeasibleBudget,
    run_terms,
    runs,
    simulate,
)
from ckptplan.solvers.segments import segment_terms
from ckptplan.solvers.selective import SaveItem
from tests.test_chain_solvers import random_chain

pytestmark = pytest.mark.torchfree


def rich_chain(rng: random.Random, n: int, count: int = 3) -> Chain:
    """A random chain using every field the chain model reads: options keeping the output,
    holding bytes past the last save, skipping a tail; own outputs, replay peaks, code between
    blocks, and the CPU's per-checkpoint RNG state."""
    base = random_chain(rng, n)
    blocks = []
    for b in base.blocks:
        shares = sorted(rng.uniform(0.05, 0.95) for _ in range(count))
        output = rng.randint(1, max(1, b.input_bytes))
        tail = b.fwd_time * rng.uniform(0.0, 0.2)
        options = tuple(
            BlockOption(
                int(b.saved_bytes * share) + (output if i % 2 else 0),
                b.fwd_time * (1 - share) ** 2 + tail,
                keeps_output=bool(i % 2),
                held_bytes=rng.randint(0, 5),
                tail_time=tail * rng.uniform(0.0, 1.0),
            )
            for i, share in enumerate(shares)
        )
        gap = rng.random() < 0.3
        blocks.append(
            replace(
                b,
                options=options,
                output_bytes=output,
                own_output_bytes=rng.choice((0, output)),
                tail_time=tail,
                replay_peak=b.fwd_peak - rng.randint(0, 10) if rng.random() < 0.5 else None,
                after_peaks=((b.fwd_peak + rng.randint(-20, 20), "gap"),) if gap else (),
            )
        )
    return Chain(tuple(blocks), base.tail_peaks, base.fixed_peaks, region_bytes=rng.randint(0, 3))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 9))
def test_segment_terms_are_run_terms(seed: int, n: int) -> None:
    chain = rich_chain(random.Random(seed), n)
    for start in range(n):
        for option in (None, 0, 1, 2):
            for end, local, saving, time in segment_terms(chain, start, option, n):
                picks = [None if option is None else b.options[option] for b in chain.blocks]
                terms = run_terms(chain, start, end, True, picks[start:end])
                assert local == terms.local_peak()[0]
                assert saving == terms.saving
                assert time == pytest.approx(terms.recompute_time, abs=1e-12)


def exact(chain: Chain, budget: int, selective: bool) -> float | None:
    """The optimum under ``budget`` read off the unbounded frontier (None: infeasible)."""
    plans = dp.frontier(chain, selective=selective)
    fitting = [p.recompute_time for p in plans if p.peak <= budget]
    return min(fitting) if fitting else None


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    n=st.integers(1, 14),
    fraction=st.floats(0.2, 1.0),
    selective=st.booleans(),
)
def test_bounded_solve_equals_the_unbounded_frontier(
    seed: int, n: int, fraction: float, selective: bool
) -> None:
    chain = rich_chain(random.Random(seed), n)
    budget = int(none(chain).peak * fraction)
    expected = exact(chain, budget, selective)
    if expected is None:
        with pytest.raises(InfeasibleBudget) as info:
            dp.solve(chain, budget, selective=selective)
        least = min(p.peak for p in dp.frontier(chain, selective=selective))
        assert info.value.least_peak == least
        return
    plan = dp.solve(chain, budget, selective=selective)
    assert plan.peak <= budget
    assert plan.recompute_time == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert simulate(chain, plan.segments, options=plan.options).peak == plan.peak


@pytest.mark.parametrize("seed", range(6))
def test_the_least_peak_is_the_frontiers_least(seed: int) -> None:
    chain = rich_chain(random.Random(seed), 12)
    for options in (False, True):
        frontier = dp.frontier(chain, selective=options)
        assert dp.least_peak(chain, selective=options) == min(p.peak for p in frontier)


@pytest.mark.parametrize("seed", range(6))
def test_prefix_bounds_never_exceed_a_real_plan(seed: int) -> None:
    """Every plan of the frontier saves, before any block, no more than ``most_saving`` and
    spends there at least ``least_time`` of what it saves."""
    chain = rich_chain(random.Random(seed), 10)
    before = prefixes(chain, selective=True)
    for plan in dp.frontier(chain, selective=True):
        chosen = dict(plan.options)
        saved, spent = 0, 0.0
        for start, end, checkpointed, _ in runs(chain, plan.segments):
            picks = [
                chain.blocks[k].options[chosen[k]] if k in chosen else None
                for k in range(start, end)
            ]
            terms = run_terms(chain, start, end, checkpointed, picks if checkpointed else ())
            saved += terms.saving
            spent += terms.recompute_time
            assert saved <= before[end].most_saving
            assert before[end].least_time(saved) <= spent + 1e-9


def uniform_chain(n: int, options: int) -> Chain:
    """``n`` identical blocks, as repeated decoder layers are, each with a menu of
    ``options``."""
    rng = random.Random(0)
    block = rich_chain(rng, 1, options).blocks[0]
    step = block.saved_bytes + block.input_bytes
    blocks = tuple(
        replace(
            block,
            name=f"b{i}",
            fwd_start=block.fwd_start + i * step,
            fwd_peak=block.fwd_peak + i * step,
            bwd_start=block.bwd_start + i * step,
            bwd_peak=block.bwd_peak + i * step,
            replay_peak=None,
            after_peaks=(),
            joins_previous=True,
        )
        for i in range(n)
    )
    tail = blocks[-1].bwd_start + 5
    return Chain(blocks, ((tail, "loss"),), ((100, "emb"),), region_bytes=2)


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.4, 0.8])
def test_a_uniform_chain_solves_as_its_frontier_says(fraction: float) -> None:
    chain = uniform_chain(24, 6)
    least = dp.least_peak(chain, selective=True)
    budget = int(least + (none(chain).peak - least) * fraction)
    expected = exact(chain, budget, True)
    assert expected is not None
    assert dp.solve(chain, budget, selective=True).recompute_time == pytest.approx(expected)


def proportional_items(rng: random.Random, k: int) -> list[SaveItem]:
    """Ops whose times are proportional to their bytes, give or take 10%, as pointwise ops
    are: nearly every sum of kept bytes is a point of the exact frontier."""
    items = []
    for i in range(k):
        size = rng.randint(1, 10**6)
        items.append(SaveItem((f"op#{i}",), size, size * 1e-9 * rng.uniform(0.9, 1.1)))
    return items


@pytest.mark.parametrize("tolerance", [0.01, 0.05, 0.2])
@pytest.mark.parametrize("seed", range(3))
def test_thinning_the_knapsack_loses_at_most_its_tolerance(
    monkeypatch: pytest.MonkeyPatch, seed: int, tolerance: float
) -> None:
    items = proportional_items(random.Random(seed), 16)
    exact_points = selective.frontier(items)
    monkeypatch.setattr(selective, "EXACT_POINTS", 8)
    thinned = selective.frontier(items, tolerance=tolerance)
    assert len(thinned) < len(exact_points)
    assert len(thinned) <= len(items) / tolerance + 2 + selective.EXACT_POINTS
    total = sum(item.time for item in items)
    for point in exact_points:
        cover = min(p.recompute_time for p in thinned if p.kept_bytes <= point.kept_bytes)
        assert cover <= point.recompute_time + tolerance * total + 1e-12
    # Both ends survive: keeping nothing, and keeping everything.
    assert thinned[0].kept_bytes == 0 and thinned[-1].recompute_time == pytest.approx(0.0)


def test_a_small_frontier_is_not_thinned() -> None:
    items = proportional_items(random.Random(0), 9)
    assert selective.frontier(items, tolerance=0.5) == selective.frontier(items)
