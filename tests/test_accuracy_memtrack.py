"""The live-storage tracker counts on fake tensors what the real CPU kernels allocate."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import ckptplan
from ckptplan.loading import load_model_file
from ckptplan.planning.problem import to_chain
from ckptplan.planning.schedule_plan import plan_from_schedule
from ckptplan.profiling.allocmeter import allocator_peak
from ckptplan.profiling.memtrack import _UNREDUCED_LOSSES, LiveStorageTracker
from ckptplan.solvers import run_solver
from ckptplan.stepping.fakerun import fake_run_peak
from ckptplan.values.budget import ResolvedBudget
from ckptplan.verifying.verification import verify_plan
from tests.conftest import MODELS

SHAPE = (4, 5, 6)


def _operands() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "x": torch.randn(*SHAPE, requires_grad=True),
        "y": torch.randn(*SHAPE),
        "p": torch.rand(*SHAPE),
        "sign": torch.randn(*SHAPE).sign(),
        "labels": torch.randint(0, SHAPE[1], (SHAPE[0], SHAPE[2])),
    }


LOSSES: dict[str, Callable[[dict[str, torch.Tensor], str], torch.Tensor]] = {
    "mse": lambda t, r: F.mse_loss(t["x"], t["y"], reduction=r),
    "smooth_l1": lambda t, r: F.smooth_l1_loss(t["x"], t["y"], reduction=r),
    "bce": lambda t, r: F.binary_cross_entropy(t["x"].sigmoid(), t["p"], reduction=r),
    "soft_margin": lambda t, r: F.soft_margin_loss(t["x"], t["sign"], reduction=r),
    "l1": lambda t, r: F.l1_loss(t["x"], t["y"], reduction=r),
    "huber": lambda t, r: F.huber_loss(t["x"], t["y"], reduction=r),
    "bce_logits": lambda t, r: F.binary_cross_entropy_with_logits(t["x"], t["p"], reduction=r),
    "cross_entropy": lambda t, r: F.cross_entropy(t["x"], t["labels"], reduction=r),
    "kl_div": lambda t, r: F.kl_div(
        t["x"].log_softmax(-1), t["p"], reduction="batchmean" if r == "mean" else r
    ),
    "mean": lambda t, r: (t["x"] * t["y"]).mean() if r == "mean" else (t["x"] * t["y"]).sum(),
}


Loss = Callable[[dict[str, torch.Tensor], str], torch.Tensor]


def _tracked(loss: Loss, reduction: str, fake: bool) -> tuple[int, int]:
    """(peak, live bytes while the loss is held) of computing the loss, on real or fake tensors."""
    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else None
    if mode is not None:
        mode.__enter__()
    try:
        operands = _operands()
        tracker = LiveStorageTracker(exclude=list(operands.values()))
        with tracker:
            held = loss(operands, reduction)
        assert held.dim() == 0
        return tracker.peak, tracker.live
    finally:
        if mode is not None:
            mode.__exit__(None, None, None)


class _OversizedOutputs(TorchDispatchMode):
    """Collects the ops whose output storage is larger than the output's elements."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[Any] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            big = isinstance(t, torch.Tensor) and (
                t.untyped_storage().nbytes() > t.numel() * t.element_size()
            )
            if big:
                self.ops.add(func)
        return out


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_fake_loss_holds_what_the_cpu_kernel_holds(name: str, reduction: str) -> None:
    real = _tracked(LOSSES[name], reduction, fake=False)
    assert _tracked(LOSSES[name], reduction, fake=True) == real


def test_the_listed_losses_are_the_kernels_that_keep_the_unreduced_storage() -> None:
    """The list in memtrack is what the CPU kernels do, not a guess: among the losses above
    exactly the listed ops return an output with more storage than elements."""
    spy = _OversizedOutputs()
    operands = _operands()
    with spy:
        for loss in LOSSES.values():
            for reduction in ("mean", "sum"):
                loss(operands, reduction)
    assert spy.ops == set(_UNREDUCED_LOSSES)


MSE_MODEL = """
import torch
def build_model():
    return torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()) for _ in range(3)]
    )
def example_inputs(batch_size=512):
    return (torch.randn(batch_size, 64),)
def loss_fn(output):
    return torch.nn.functional.mse_loss(output, torch.zeros_like(output))
"""


def test_fake_run_of_an_mse_step_matches_the_measured_peak(write_model) -> None:
    """The U-Net's 1.5 MiB miss in small: the scalar MSE keeps a batch-sized buffer."""
    path = write_model(MSE_MODEL)
    profile = ckptplan.profile(path)
    chain = to_chain(profile)
    schedule = run_solver("none", chain, None)
    plan = plan_from_schedule(profile, chain, schedule, ResolvedBudget("none", schedule.peak))
    workload = load_model_file(path)
    measured = verify_plan(workload, plan, repeats=1).measured_peak_bytes
    # The allocator also sees AdamW's wrapped-number scalars (8 B each), made outside dispatch.
    assert measured - 64 <= fake_run_peak(workload, plan) == schedule.peak <= measured


def _summed_gradients(w: torch.Tensor, x: torch.Tensor) -> dict[str, Callable[[], None]]:
    """Steps in which the engine sums gradients bound for one input (``gradsum``)."""

    def leaf_read_four_times() -> None:
        sum((w * x[i]).sum() for i in range(4)).backward()

    def slices_of_one_tensor() -> None:
        h = w * 2
        sum((h[i] * x[i]).sum() for i in range(8)).backward()

    def onto_an_existing_gradient() -> None:
        w.grad = torch.zeros_like(w)
        sum((w * x[i]).sum() for i in range(4)).backward()

    def one_gradient_for_two_inputs() -> None:  # held twice: out of place in the real step too
        h = w * 2
        (x * (h + h.tanh() + h.sigmoid())).sum().backward()

    def recurrence() -> None:
        a, b = (w * 0.1).exp().view(8, 16, 64), (w * 2).view(8, 16, 64)
        state, states = torch.zeros(8, 64), []
        for t in range(16):
            state = a[:, t] * state + b[:, t]
            states.append(state)
        torch.stack(states, 1).sum().backward()

    steps = [
        leaf_read_four_times,
        slices_of_one_tensor,
        onto_an_existing_gradient,
        one_gradient_for_two_inputs,
        recurrence,
    ]
    return {step.__name__: step for step in steps}


@pytest.mark.parametrize("name", sorted(_summed_gradients(torch.empty(0), torch.empty(0))))
def test_gradient_sums_are_counted_as_the_real_engine_makes_them(name: str) -> None:
    """Under the tracker's dispatch mode, or on fake tensors, the engine sums gradients out of
    place; the real step sums in place where it can: the tracker counts the real step's peak,
    the allocator's to the byte, on real and fake tensors alike."""
    torch.manual_seed(0)
    w, x = torch.randn(128, 64, requires_grad=True), torch.randn(128, 64)
    with FakeTensorMode() as mode:
        fake_w, fake_x = mode.from_tensor(w).requires_grad_(), mode.from_tensor(x)
    peaks = []
    for tensors, fake in (((w, x), False), ((fake_w, fake_x), True)):
        step = _summed_gradients(*tensors)[name]
        tracker = LiveStorageTracker(exclude=tensors)
        with mode if fake else contextlib.nullcontext(), tracker:
            step()
        tensors[0].grad = None
        peaks.append(tracker.peak)
    measured = allocator_peak(_summed_gradients(w, x)[name]).step
    # The allocator also sees the 8-byte scalars Python numbers become, made outside dispatch.
    assert peaks[0] == peaks[1]
    assert measured - 16 <= peaks[0] <= measured


def test_a_step_that_sums_many_gradients_is_predicted_at_its_measured_peak() -> None:
    """A weight and an input read at every step of a recurrence, and a tied head: predicted
    1 MiB (9%) over the allocator while the profiler's modes made every sum out of place."""
    path = MODELS / "scan_lm.py"
    plan = ckptplan.solve(path, budget="100%", solver="full", margin=0)
    check = ckptplan.verify(path, plan, repeats=1)
    assert plan.predicted.fake_run_peak_bytes == check.predicted_peak_bytes
    assert check.predicted_peak_bytes == check.measured_peak_bytes
