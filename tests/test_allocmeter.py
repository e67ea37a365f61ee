"""The CPU allocator's event stream as an instrument independent of ckptplan's tracker."""

from __future__ import annotations

import torch

import ckptplan
from ckptplan.profiling.allocmeter import allocator_peak
from ckptplan.profiling.memtrack import LiveStorageTracker, rng_states_counted
from ckptplan.profiling.workspace import Workspaces
from tests.conftest import ROOT


def test_the_allocator_sees_memory_made_outside_dispatch() -> None:
    """A checkpoint's RNG state comes from the generator, not from an aten op: the allocator
    counts it, the tracker only when told to."""
    states: list[torch.Tensor] = []

    def step() -> None:
        states.append(torch.get_rng_state())

    size = torch.get_rng_state().numel()
    original = torch.get_rng_state
    assert allocator_peak(step).step >= size
    blind = LiveStorageTracker()
    with blind:
        step()
    told = LiveStorageTracker()
    with told, rng_states_counted(told):
        step()
    assert (blind.peak, told.peak) == (0, size)
    assert torch.get_rng_state is original, "the counting wrapper is gone after the step"


def test_a_gradient_leaves_the_activation_figure_once_accumulated() -> None:
    layer = torch.nn.Linear(512, 512, bias=False)
    x = torch.randn(64, 512)
    grad_bytes = 512 * 512 * 4

    def step() -> None:
        layer(x).square().sum().backward()
        torch.ones(4 * grad_bytes // 4)  # the step's peak, once the gradient exists

    peak = allocator_peak(step, layer)
    assert peak.step - peak.activations == grad_bytes
    layer.zero_grad(set_to_none=True)
    unmarked = allocator_peak(step)
    assert unmarked.step == unmarked.activations == peak.step


def test_verify_measures_with_the_allocator_and_the_plan_counts_each_region_state() -> None:
    """GPT has dropout, so every region stashes the CPU RNG state: prediction, fake run,
    allocator and tracker agree to the byte."""
    model = ROOT / "sample_models" / "gpt.py"
    plan = ckptplan.solve(model, budget="60%", solver="dp", scope="activations", batch_size=1)
    assert len(plan.regions) >= 2
    check = ckptplan.verify(model, plan, repeats=1)
    assert check.tracked_peak_bytes == check.measured_peak_bytes
    assert plan.predicted.fake_run_peak_bytes == check.measured_peak_bytes
    assert check.predicted_peak_bytes == check.measured_peak_bytes <= check.budget_bytes


def test_the_tracker_counts_the_buffers_a_convolution_allocates_inside_its_kernel() -> None:
    """A depthwise convolution's backward builds columns below dispatch (ConvNeXt's 7%)."""
    conv = torch.nn.Conv2d(64, 64, 7, padding=3, groups=64)
    x = torch.randn(8, 64, 56, 56, requires_grad=True)

    def step() -> None:
        conv(x).sum().backward()
        conv.zero_grad(set_to_none=True)
        x.grad = None

    step()
    measured = allocator_peak(step).step
    blind, told = LiveStorageTracker(), LiveStorageTracker(workspaces=Workspaces())
    for tracker in (blind, told):
        with tracker:
            step()
    assert blind.peak < measured == told.peak


def test_a_mixed_precision_plan_is_measured_as_its_fake_run_counted_it() -> None:
    """oneDNN packs a bf16 GEMM's operands in buffers of its own, below dispatch: under autocast
    they were the 3% the fake run missed with every block checkpointed."""
    model = ROOT / "tests" / "models" / "tiny_gpt.py"
    plan = ckptplan.solve(model, budget="1.0", solver="full", dtype="bf16-mixed", batch_size=4)
    result = ckptplan.verify(model, plan, run_on="cpu", repeats=1)
    assert result.tracked_peak_bytes == result.measured_peak_bytes
    assert result.measured_peak_bytes == plan.predicted.fake_run_peak_bytes
