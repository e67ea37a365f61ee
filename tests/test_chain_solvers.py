"""The chain solvers against brute force, and against each other, on random chains."""

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptplan.solvers import run_solver
from ckptplan.solvers.baselines import every_k, full, none, sqrt
from ckptplan.solvers.chain import Chain, ChainBlock, InfeasibleBudget, simulate
from ckptplan.solvers.dp import frontier, solve

pytestmark = pytest.mark.torchfree


def random_chain(rng: random.Random, n: int) -> Chain:
    """A plausible unchecked timeline: forward accumulates saved bytes, backward releases them."""
    persistent = rng.randint(50, 200)
    live = persistent
    shapes = []
    for _ in range(n):
        shapes.append((rng.randint(1, 20), rng.randint(5, 80), rng.random() < 0.8))
    blocks_fwd = []
    for inp, saved, _kept in shapes:
        start = live
        live += saved + inp
        blocks_fwd.append((start, live + rng.randint(0, 30)))
    tail = live + rng.randint(0, 40)
    blocks = [None] * n
    grads = 0
    for i in range(n - 1, -1, -1):
        inp, saved, kept = shapes[i]
        start = live + grads
        peak = start + rng.randint(5, 60)
        live -= saved + inp
        grads += rng.randint(0, 10)
        blocks[i] = ChainBlock(
            name=f"b{i}",
            fwd_time=rng.uniform(0.5, 3.0),
            input_bytes=inp,
            saved_bytes=saved,
            input_kept=kept,
            fwd_start=blocks_fwd[i][0],
            fwd_peak=blocks_fwd[i][1],
            fwd_peak_nograd=rng.randint(0, 30),
            bwd_start=start,
            bwd_peak=peak,
            joins_previous=i == 0 or rng.random() < 0.9,
        )
    return Chain(tuple(blocks), tail_peaks=((tail, "loss"),), fixed_peaks=((persistent, "emb"),))


def brute_force(chain: Chain, budget: int) -> float | None:
    best = None
    for segments in all_segmentations_fast(chain):
        plan = simulate(chain, segments)
        if plan.peak <= budget and (best is None or plan.recompute_time < best):
            best = plan.recompute_time
    return best


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 7), fraction=st.floats(0.3, 1.0))
def test_dp_equals_brute_force(seed: int, n: int, fraction: float) -> None:
    chain = random_chain(random.Random(seed), n)
    budget = int(none(chain).peak * fraction)
    expected = brute_force(chain, budget)
    if expected is None:
        with pytest.raises(InfeasibleBudget):
            solve(chain, budget)
        return
    plan = solve(chain, budget)
    assert plan.peak <= budget
    assert plan.recompute_time == pytest.approx(expected)
    assert simulate(chain, plan.segments).peak == plan.peak


@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2))])
def test_dp_equals_brute_force_on_twelve_blocks(seed: int) -> None:
    rng = random.Random(seed)
    chain = random_chain(rng, 12)
    plans = [simulate(chain, s) for s in all_segmentations_fast(chain)]
    for fraction in (0.5, 0.7, 0.9):
        budget = int(none(chain).peak * fraction)
        fitting = [p.recompute_time for p in plans if p.peak <= budget]
        if not fitting:
            with pytest.raises(InfeasibleBudget):
                solve(chain, budget)
            continue
        assert solve(chain, budget).recompute_time == pytest.approx(min(fitting))


def all_segmentations_fast(chain: Chain):
    """Every flat plan of a chain, each once (recursive enumeration for 12 blocks)."""
    n = len(chain.blocks)

    def rest(k: int):
        if k == n:
            yield []
            return
        for tail in rest(k + 1):
            yield tail
        for end in range(k + 1, n + 1):
            if end > k + 1 and not chain.blocks[end - 1].joins_previous:
                break
            for tail in rest(end):
                yield [(k, end), *tail]

    yield from rest(0)


@pytest.mark.parametrize("seed", range(20))
def test_dp_never_loses_to_fixed_policies(seed: int) -> None:
    chain = random_chain(random.Random(seed), random.Random(seed).randint(2, 30))
    for baseline in (full(chain), sqrt(chain), every_k(chain, 2), every_k(chain, 3)):
        plan = solve(chain, baseline.peak)
        assert plan.peak <= baseline.peak
        assert plan.recompute_time <= baseline.recompute_time + 1e-9


def test_frontier_trades_memory_for_time() -> None:
    chain = random_chain(random.Random(7), 16)
    plans = frontier(chain)
    assert len(plans) > 2
    for faster, smaller in itertools.pairwise(plans):
        assert faster.recompute_time < smaller.recompute_time
        assert faster.peak > smaller.peak
    assert plans[0].segments == ()


def test_plans_change_with_the_budget() -> None:
    chain = random_chain(random.Random(3), 12)
    low, high = full(chain).peak, none(chain).peak
    budgets = [int(low + (high - low) * f) for f in (0.0, 0.3, 0.6, 1.0)]
    plans = [solve(chain, b) for b in budgets]
    times = [p.recompute_time for p in plans]
    assert times == sorted(times, reverse=True)
    assert times[0] > times[-1] == 0.0
    assert len({p.segments for p in plans}) >= 3


def test_baselines_have_their_shapes() -> None:
    chain = random_chain(random.Random(1), 9)
    assert none(chain).segments == ()
    assert len(full(chain).segments) == 9
    assert every_k(chain, 3).segments == ((2, 3), (5, 6), (8, 9))
    covered = sum(e - s for s, e in sqrt(chain).segments)
    assert covered == 9


def test_run_solver_rejects_an_infeasible_baseline() -> None:
    chain = random_chain(random.Random(2), 5)
    with pytest.raises(InfeasibleBudget) as info:
        run_solver("none", chain, full(chain).peak - 1)
    assert info.value.least_peak == none(chain).peak


def with_options(chain: Chain, rng: random.Random, count: int = 2) -> Chain:
    """Every block gets the same ``count`` selective options (repeated layers share a menu)."""
    from dataclasses import replace

    from ckptplan.solvers.chain import BlockOption

    shares = sorted(rng.uniform(0.1, 0.9) for _ in range(count))
    blocks = tuple(
        replace(
            b,
            options=tuple(
                BlockOption(
                    int(b.saved_bytes * share),
                    b.fwd_time * (1 - share) ** 2,
                    keeps_output=i == 1,
                )
                for i, share in enumerate(shares)
            ),
        )
        for b in chain.blocks
    )
    return Chain(blocks, chain.tail_peaks, chain.fixed_peaks)


def selective_plans(chain: Chain):
    """Every flat plan with, per segment, no option or one option index for all its blocks."""
    count = len(chain.blocks[0].options)
    for segments in all_segmentations_fast(chain):
        for picks in itertools.product([None, *range(count)], repeat=len(segments)):
            options = [
                (k, pick)
                for (start, end), pick in zip(segments, picks, strict=True)
                if pick is not None
                for k in range(start, end)
            ]
            yield simulate(chain, segments, options=options)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 6), fraction=st.floats(0.3, 1.0))
def test_selective_dp_equals_brute_force(seed: int, n: int, fraction: float) -> None:
    rng = random.Random(seed)
    chain = with_options(random_chain(rng, n), rng)
    budget = int(none(chain).peak * fraction)
    fitting = [p.recompute_time for p in selective_plans(chain) if p.peak <= budget]
    if not fitting:
        with pytest.raises(InfeasibleBudget):
            solve(chain, budget, selective=True)
        return
    plan = solve(chain, budget, selective=True)
    assert plan.peak <= budget
    assert plan.recompute_time == pytest.approx(min(fitting))
    assert simulate(chain, plan.segments, options=plan.options).peak == plan.peak


def test_a_kept_output_costs_memory_inside_a_segment_only() -> None:
    from ckptplan.solvers.chain import BlockOption, run_terms

    plain = random_chain(random.Random(5), 3)
    sizes = [b.input_bytes for b in plain.blocks[1:]] + [7]
    blocks = tuple(
        ChainBlock(
            **{
                **b.__dict__,
                "joins_previous": True,
                "output_bytes": size,
                "options": (BlockOption(size, 0.0, keeps_output=True),),
            }
        )
        for b, size in zip(plain.blocks, sizes, strict=True)
    )
    chain = Chain(blocks, plain.tail_peaks, plain.fixed_peaks)
    alone = simulate(chain, [(0, 1)], options=[(0, 0)])
    assert alone.peak == simulate(chain, [(0, 1)]).peak, "the segment's output lives on anyway"
    kept = run_terms(chain, 0, 2, True, [blocks[0].options[0], blocks[1].options[0]]).saving
    assert kept == run_terms(chain, 0, 2, True).saving - blocks[0].output_bytes


def test_code_between_blocks_is_lowered_by_the_checkpoints_before_it() -> None:
    """A stage's downsampling runs unchecked between two blocks that cannot share a region;
    its peak drops by the savings of the checkpointed blocks before it, and only by those."""
    blocks = tuple(
        ChainBlock(
            f"b{i}",
            fwd_time=1.0,
            input_bytes=10,
            saved_bytes=30,
            input_kept=True,
            fwd_start=100 + 40 * i,
            fwd_peak=150 + 40 * i,
            fwd_peak_nograd=20,
            bwd_start=140 + 40 * i,
            bwd_peak=170 + 40 * i,
            joins_previous=i != 2,
            after_peaks=((400, "downsampling"),) if i == 1 else (),
        )
        for i in range(4)
    )
    chain = Chain(blocks)
    assert simulate(chain, []).peak_event == "downsampling"
    first_stage = simulate(chain, [(0, 2)])
    second_stage = simulate(chain, [(2, 4)])
    assert first_stage.peak < 400 == second_stage.peak
    with pytest.raises(ValueError, match="cannot join"):
        simulate(chain, [(1, 3)])
    assert solve(chain, budget=399).segments[0][0] < 2
