"""The chain model's peak is the peak of the checkpointed step executed on fake tensors.

ResNet's basic blocks end in a ReLU, which saves its own output: a checkpointed block drops it,
so its recomputation starts without it (``ChainBlock.own_output_bytes``), and a later member of
a segment recomputes with its input (the member before's output) live.

A U-Net encoder level's output is also a decoder level's skip input, so the next level never
joins a segment to it (a joined segment would drop the skip at some events and not others).
"""

from __future__ import annotations

import pytest

import ckptplan
from ckptplan.loading import load_model_file
from ckptplan.planning.problem import to_chain
from ckptplan.planning.schedule_plan import plan_from_schedule
from ckptplan.solvers.chain import simulate
from ckptplan.stepping.fakerun import fake_run_peak
from ckptplan.values.budget import ResolvedBudget
from tests.conftest import ROOT


def _predicted_and_fake(model: str, segments: list[tuple[int, int]]) -> tuple[int, int]:
    path = ROOT / "sample_models" / f"{model}.py"
    profile = ckptplan.profile(path, batch_size=2)
    chain = to_chain(profile)
    schedule = simulate(chain, segments)
    plan = plan_from_schedule(profile, chain, schedule, ResolvedBudget("test", schedule.peak))
    return schedule.peak, fake_run_peak(load_model_file(path), plan)


@pytest.mark.parametrize(
    ("model", "segments"),
    [
        pytest.param("resnet", [(k, k + 1) for k in range(8)], id="resnet-full"),
        pytest.param("resnet", [(0, 3), (3, 6), (6, 8)], id="resnet-sqrt"),
        pytest.param("unet", [(0, 1), (2, 3), (4, 5), (6, 7)], id="unet-every-2"),
        pytest.param("mlp", [(0, 4), (4, 8), (8, 12), (12, 16)], id="mlp-sqrt"),
    ],
)
def test_predicted_peak_is_the_fake_run_peak(model: str, segments: list[tuple[int, int]]) -> None:
    predicted, fake = _predicted_and_fake(model, segments)
    # Not modelled: the copies of BatchNorm's running statistics that applying/install.py keeps
    # while a region recomputes (528 B per ResNet block here), a few 1e-5 of the peak.
    assert predicted == pytest.approx(fake, rel=1e-4)


def test_a_block_whose_input_a_later_block_takes_too_starts_its_segment() -> None:
    profile = ckptplan.profile(ROOT / "sample_models" / "unet.py", batch_size=2)
    joins = {b.name: b.joins_previous for b in to_chain(profile).blocks}
    # encoder.1-4 take an encoder output that a decoder level takes again as its skip.
    assert not any(joins[f"encoder.{k}"] for k in range(1, 5))
