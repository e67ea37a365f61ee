"""Nested checkpointing of enclosing modules (a stage whole, each of its blocks again inside).

The DP against brute force on random chains with a stage; then Hugging Face's Swin, built from
its library's config, whose stages qualify: a nested plan's prediction against the fake run
and the real step, its gradients, and how often each region recomputes.
"""

from __future__ import annotations

import random

import pytest
import torch

import ckptplan
from ckptplan.huggingface import training_conventions
from ckptplan.loading import call_model, load_model_file
from ckptplan.planning.problem import to_chain
from ckptplan.planning.schedule_plan import plan_from_schedule
from ckptplan.profiling.profiler import Profile
from ckptplan.solvers.chain import AfterCode, Chain, Enclosure, InfeasibleBudget, simulate
from ckptplan.solvers.dp import solve
from ckptplan.values.budget import ResolvedBudget
from tests.conftest import ROOT
from tests.test_chain_solvers import all_segmentations_fast, random_chain

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)


def _staged(seed: int, n: int) -> Chain:
    """A random chain with one enclosure of two or more blocks, with or without own code."""
    rng = random.Random(seed)
    chain = random_chain(rng, n)
    start = rng.randrange(0, n - 1)
    end = rng.randrange(start + 2, n + 1)
    last = chain.blocks[end - 1]
    after = None
    if rng.random() < 0.6:
        saved = rng.randint(5, 60)
        after = AfterCode(
            fwd_start=last.fwd_peak,
            fwd_peak=last.fwd_peak + saved + rng.randint(0, 20),
            bwd_start=last.bwd_start + saved,
            bwd_peak=last.bwd_start + saved + rng.randint(0, 30),
            saved_bytes=saved,
            fwd_time=rng.uniform(0.1, 1.0),
        )
    return Chain(
        chain.blocks, chain.tail_peaks, chain.fixed_peaks, (Enclosure("s", start, end, after),)
    )


def _every_plan(chain: Chain):
    """Every flat plan, and every flat plan of the other blocks with the stage nested."""
    stage = chain.enclosures[0]
    for segments in all_segmentations_fast(chain):
        yield simulate(chain, segments)
        if all(e <= stage.start or s >= stage.end for s, e in segments):
            yield simulate(chain, segments, nested=(0,))


@pytest.mark.parametrize("seed", range(25))
def test_dp_with_a_nested_stage_equals_brute_force(seed: int) -> None:
    chain = _staged(seed, 3 + seed % 5)
    plans = list(_every_plan(chain))
    for fraction in (0.4, 0.6, 0.8):
        budget = int(plans[0].peak * fraction)
        fitting = [p.recompute_time for p in plans if p.peak <= budget]
        if not fitting:
            with pytest.raises(InfeasibleBudget):
                solve(chain, budget)
            continue
        plan = solve(chain, budget)
        assert plan.recompute_time == pytest.approx(min(fitting))
        assert simulate(chain, plan.segments, nested=plan.nested).peak == plan.peak <= budget


def test_a_nested_stage_drops_more_than_its_blocks_checkpointed_one_by_one() -> None:
    chain = _staged(3, 6)
    stage = chain.enclosures[0]
    one_by_one = [(k, k + 1) for k in range(stage.start, stage.end)]
    nested = simulate(chain, [], nested=(0,))
    flat = simulate(chain, one_by_one)
    assert nested.recompute_time > flat.recompute_time
    assert nested.peak <= flat.peak


pytest.importorskip("transformers")
SWIN = ROOT / "sample_models" / "zoo" / "hf_swin.py"


@pytest.fixture(scope="module")
def swin() -> tuple[Profile, Chain]:
    profile = ckptplan.profile(SWIN)
    return profile, to_chain(profile, "activations")


def test_swin_stages_enclose_their_blocks_and_their_patch_merging(swin) -> None:
    chain = swin[1]
    stages = [(e.name, e.end - e.start, e.after is not None) for e in chain.enclosures]
    assert stages == [
        ("swin.encoder.layers.0", 2, True),
        ("swin.encoder.layers.1", 2, True),
        ("swin.encoder.layers.2", 6, True),
    ]


@pytest.mark.parametrize(
    ("segments", "nested"),
    [([], (0,)), ([(10, 11), (11, 12)], (0, 1, 2))],
    ids=["first stage nested", "every stage nested"],
)
def test_a_nested_plan_predicts_what_the_real_step_measures(swin, segments, nested) -> None:
    """The first plan peaks later, in the last stage, lowered by what the nested stage drops
    through forward; the second peaks in the first stage's backward."""
    profile, chain = swin
    schedule = simulate(chain, segments, nested=nested)
    plan = plan_from_schedule(
        profile, chain, schedule, ResolvedBudget("", schedule.peak, "activations")
    )
    check = ckptplan.verify(SWIN, plan, repeats=1)
    # The model may keep a saved tensor a little longer than the step does (to its node's
    # end); the allocator also sees a few scalars made outside dispatch (the CPU's margin).
    assert 0 <= schedule.peak - check.tracked_peak_bytes <= 256
    assert abs(check.measured_peak_bytes - schedule.peak) <= 0.001 * schedule.peak
    assert check.max_grad_abs_diff <= 1e-6
    one_by_one = simulate(chain, [(k, k + 1) for k in range(chain.enclosures[0].end)])
    if nested == (0,):
        assert schedule.peak < one_by_one.peak


def test_a_nested_stage_recomputes_once_and_its_blocks_twice(swin) -> None:
    profile, chain = swin
    schedule = simulate(chain, [], nested=(0,))
    plan = plan_from_schedule(
        profile, chain, schedule, ResolvedBudget("", schedule.peak, "activations")
    )
    workload = load_model_file(SWIN)
    torch.manual_seed(0)
    model = workload.build()
    inputs, _ = training_conventions(model, workload.inputs(None))
    ckptplan.apply(model.train(), plan)
    workload.loss(call_model(model, inputs)).backward()
    applied = model.ckptplan_applied
    assert [(s.name, s.recomputes) for s in applied.stats] == [("swin.encoder.layers.0", 1)]
    # Each block runs again in the stage's recomputation, and once more in its own backward.
    assert [s.recomputes for s in applied.nested_stats] == [2, 2]
