"""A budget no single-rank plan fits names the FSDP world size that would, and following the
advice gives a plan."""

from __future__ import annotations

import re

import pytest

import ckptplan
from ckptplan.errors import BelowLeastPeak
from ckptplan.planning.scaleout import least_rank_peak, ranks_that_fit
from tests.conftest import MODELS

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)

MODEL = MODELS / "tiny_gpt.py"


@pytest.fixture(scope="module")
def whole() -> ckptplan.profiling.profiler.Profile:
    return ckptplan.profile(MODEL)


def test_the_least_rank_peak_falls_with_the_world_size(whole) -> None:
    peaks = [least_rank_peak(whole, n, "step") for n in (1, 2, 4, 8, 64)]
    assert peaks == sorted(peaks, reverse=True) and peaks[0] > peaks[-1]


def test_the_refusal_names_the_least_world_size_that_fits_and_it_does(whole) -> None:
    over_two, under_four = least_rank_peak(whole, 2, "step"), least_rank_peak(whole, 4, "step")
    budget = (over_two + under_four) // 2
    assert ranks_that_fit(whole, budget, "step") == 4
    with pytest.raises(BelowLeastPeak) as refusal:
        ckptplan.solve(MODEL, budget=budget, solver="dp", margin=0)
    message = str(refusal.value)
    assert "\n" not in message
    ranks = int(re.search(r"world_size=(\d+) strategy='fsdp' fits", message).group(1))
    assert ranks == 4
    plan = ckptplan.solve(
        MODEL, budget=budget, solver="dp", margin=0, world_size=ranks, strategy="fsdp"
    )
    assert plan.predicted.peak_bytes <= budget


def test_a_budget_sharding_cannot_reach_says_so(whole) -> None:
    budget = least_rank_peak(whole, 1024, "step") - 1
    assert ranks_that_fit(whole, budget, "step") is None
    with pytest.raises(BelowLeastPeak, match="sharding cannot fit it: even over 1024 FSDP"):
        ckptplan.solve(MODEL, budget=budget, solver="dp", margin=0)
