"""``benchmarks/pair_stats.py``: what a compiled plan's paired timings can say about its
predicted overhead (Note [how sure a measured overhead is])."""

from __future__ import annotations

import importlib.util
import random

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.torchfree

spec = importlib.util.spec_from_file_location("pair_stats", ROOT / "benchmarks" / "pair_stats.py")
pair_stats = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pair_stats)


def test_the_median_interval_holds_a_skewed_distributions_median_as_often_as_it_says() -> None:
    draw = random.Random(0)
    median = 1.0  # lognormal(0, 1)'s: exp(0); its mean is 1.65, so the skew is marked
    held = 0
    for _ in range(2000):
        ratios = [draw.lognormvariate(0.0, 1.0) for _ in range(64)]
        low, high = pair_stats.median_interval(ratios)
        held += low <= median <= high
    assert 0.93 <= held / 2000 <= 0.99  # binomial ranks 24 and 41 of 64 cover 96.7%


def test_the_interval_narrows_as_pairs_are_added() -> None:
    draw = random.Random(1)
    widths = []
    for n in (16, 64, 256):
        low, high = pair_stats.median_interval([draw.gauss(1.0, 0.03) for _ in range(n)])
        widths.append(high - low)
    assert widths[0] > widths[1] > widths[2]


def test_a_one_point_overhead_in_three_point_noise_cannot_decide_the_25_percent_test() -> None:
    draw = random.Random(2)
    noisy = [1.015 + draw.gauss(0.0, 0.022) for _ in range(64)]  # IQR ~3 points, as measured
    check = pair_stats.overhead_check(noisy, predicted=0.015)
    assert not check["within_25_percent_decidable"]
    low, high = check["measured_overhead_interval95"]
    assert low < check["measured_overhead"] < high
    quiet = [1.10 + draw.gauss(0.0, 0.022) for _ in range(64)]  # Llama's 0.3 point: +10%
    decided = pair_stats.overhead_check(quiet, predicted=0.05)
    assert decided["within_25_percent_decidable"]
    assert not decided["prediction_within_25_percent"]
    assert not decided["prediction_within_interval95"]
