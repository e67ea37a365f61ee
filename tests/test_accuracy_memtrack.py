"""The live-storage tracker counts on fake tensors what the real CPU kernels allocate."""

from __future__ import annotations

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
from ckptplan.profiling.memtrack import _UNREDUCED_LOSSES, LiveStorageTracker
from ckptplan.solvers import run_solver
from ckptplan.verifying.fakerun import fake_run_peak
from ckptplan.verifying.verification import verify_plan

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
    plan = plan_from_schedule(profile, chain, schedule, "none", schedule.peak)
    workload = load_model_file(path)
    measured = verify_plan(workload, plan, repeats=1).measured_peak_bytes
    # The allocator also sees AdamW's wrapped-number scalars (8 B each), made outside dispatch.
    assert measured - 64 <= fake_run_peak(workload, plan) == schedule.peak <= measured
