"""The profile describes the step as it runs unwatched: what its instrumentation must not change,
what a checkpointed block drops, and op times that one burst of machine load does not skew."""

from __future__ import annotations

import statistics

import pytest
from torch.utils.module_tracker import ModuleTracker

import ckptplan
from ckptplan.devices import get_device, op_kind
from ckptplan.loading import load_model_file
from ckptplan.planning.problem import to_chain
from ckptplan.planning.schedule_plan import plan_from_schedule
from ckptplan.profiling import stepruns
from ckptplan.profiling.costs import OpRecorder
from ckptplan.profiling.profiler import Settings, profile_model
from ckptplan.profiling.steptiming import median_times
from ckptplan.solvers.chain import simulate
from ckptplan.stepping.fakerun import fake_run_peak
from ckptplan.values.budget import ResolvedBudget
from ckptplan.values.profile_types import OpRecord
from ckptplan.verifying import pairtiming
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)

UNET = ROOT / "sample_models" / "unet.py"
RESNET = ROOT / "sample_models" / "resnet.py"


def _unet_encoder_plan_error() -> tuple[int, int, str]:
    """(predicted, fake-run) peak of the U-Net with every level checkpointed, whose peak is in
    the encoder's backward, while the decoder's input gradients wait for the skips'."""
    profile = ckptplan.profile(UNET, batch_size=1)
    chain = to_chain(profile)
    schedule = simulate(chain, [(k, k + 1) for k in range(len(profile.blocks))])
    plan = plan_from_schedule(profile, chain, schedule, ResolvedBudget("encoder", schedule.peak))
    return schedule.peak, fake_run_peak(load_model_file(UNET), plan), schedule.peak_event


def test_module_tracking_holds_no_gradient() -> None:
    predicted, fake, event = _unet_encoder_plan_error()
    assert event.startswith("backward of encoder.")
    assert predicted == fake


def test_torch_module_tracker_would_hold_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the profiler has its own tracker: torch's keeps each decoder block's input gradient
    until its skip's gradient exists, so the profile's backward looked bigger than the step's."""
    monkeypatch.setattr(stepruns, "QuietModuleTracker", ModuleTracker)
    predicted, fake, _ = _unet_encoder_plan_error()
    assert predicted > fake


BLOCKS = """
import torch
class Block(torch.nn.Module):
    def __init__(self, act, cache):
        super().__init__()
        self.fc, self.act, self.cache, self.seen = torch.nn.Linear(32, 32), act, cache, None
    def forward(self, x):
        out = self.act(self.fc(x))
        if self.cache:
            self.seen = out
        return out
def build_model():
    return torch.nn.Sequential(*[Block(torch.nn.{act}(), {cache}) for _ in range(3)])
def example_inputs(batch_size=16):
    return (torch.randn(batch_size, 32),)
def loss_fn(output):
    return output.square().mean()
"""


@pytest.mark.parametrize(
    ("act", "cache", "own"),
    [
        ("ReLU", False, True),  # ReLU saves its result: only the block itself keeps its output
        ("GELU", False, False),  # GELU saves its input: the output is the next block's to keep
        ("ReLU", True, False),  # the module holds its output: alive whatever autograd does
    ],
)
def test_own_output_is_what_only_the_block_keeps(write_model, act: str, cache: bool, own: bool):
    path = write_model(BLOCKS.replace("{act}", act).replace("{cache}", str(cache)))
    blocks = profile_model(load_model_file(path), Settings()).blocks
    assert [b.own_output_bytes for b in blocks] == [b.output_bytes if own else 0 for b in blocks]


def test_resnet_blocks_own_their_output() -> None:
    """Every basic block ends in a ReLU; a checkpointed one drops that output until recompute."""
    profile = ckptplan.profile(RESNET, batch_size=2)
    assert all(b.own_output_bytes == b.output_bytes > 0 for b in profile.blocks)


def _step(times: list[float]) -> OpRecorder:
    recorder = OpRecorder(get_device("cpu"), ModuleTracker(), measure=True)
    recorder.records = [
        OpRecord(f"aten.op{i}", "fwd:0", "", False, 4, 0, 0.0, t, False, False)
        for i, t in enumerate(times)
    ]
    return recorder


def test_measured_op_time_is_the_median_of_the_steps() -> None:
    quiet, burst = [1.0, 2.0, 3.0], [9.0, 2.5, 30.0]
    merged = median_times([_step(quiet), _step(burst), _step([1.1, 1.9, 3.1])])
    assert [r.time for r in merged.records] == [1.1, 2.0, 3.1]


def test_steps_with_different_ops_keep_the_median_step() -> None:
    steps = [_step([1.0, 1.0]), _step([5.0]), _step([2.0, 2.0])]
    assert median_times(steps) is steps[2]


def test_step_time_ratio_survives_load_that_hits_one_side(monkeypatch: pytest.MonkeyPatch):
    """5x bursts of load that catch the baseline's step more often than the candidate's make the
    ratio of the medians meaningless; the median of the back-to-back pairs is still 1.3."""
    # Rounds alternate (baseline, candidate), (candidate, baseline), ...; the 5s are bursts.
    load = iter([1, 1, 5, 5, 5, 1, 1, 5, 1, 1])
    cost = {"baseline": 1.0, "candidate": 1.3}
    monkeypatch.setattr(
        pairtiming, "timed_step", lambda _file, run, _target: cost[run] * next(load)
    )
    runs = {name: name for name in cost}
    times = pairtiming.paired_times(None, runs, None, repeats=5)  # type: ignore[arg-type]
    assert statistics.median(pairtiming.pair_ratios(times)) == pytest.approx(1.3)
    ratio_of_medians = statistics.median(times["candidate"]) / statistics.median(times["baseline"])
    assert ratio_of_medians == pytest.approx(0.26)


@pytest.mark.parametrize("model", ["gpt.py", "resnet.py"])
def test_every_op_that_does_math_runs_against_a_compute_roofline(model: str) -> None:
    """An op with FLOPs classed as memory-bound would have its compute priced at the memory
    share of peak: matmuls, convolutions (and their backward) and attention are all found."""
    profile = ckptplan.profile(ROOT / "sample_models" / model)
    kinds = {op.op: op_kind(op.op) for op in profile.ops if op.flops > 0}
    assert kinds and all(kind != "memory" for kind in kinds.values()), kinds
