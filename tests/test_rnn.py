"""Recurrent layers: the LSTM's oneDNN workspace and scratch are counted, and its plans hold.

The fake kernel of ``aten.mkldnn_rnn_layer`` returns its workspace empty, and the real kernel
allocates scratch inside itself; a stack of LSTMs was predicted at a third of its measured
peak before ``ckptplan.profiling.rnn`` sized them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import ckptplan
from ckptplan.errors import CkptplanError
from ckptplan.profiling import rnn
from ckptplan.profiling.memtrack import real_storage_bytes
from tests.conftest import MODELS, ROOT
from tests.models import small_lstm

STACK = MODELS / "small_lstm.py"


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """oneDNN's LSTM on two intra-op threads spin-waits on a busy two-core machine: a tiny step
    takes seconds instead of milliseconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _layer_args(x: torch.Tensor, hidden: int) -> tuple:
    gates = 4 * hidden
    weights = (torch.randn(gates, x.shape[-1]), torch.randn(gates, hidden))
    biases = (torch.randn(gates), torch.randn(gates))
    state = (torch.zeros(x.shape[1], hidden), torch.zeros(x.shape[1], hidden))
    return (x, *weights, *biases, *state, False, [], 2, hidden, 1, True, False, False, True)


def test_the_fake_workspace_is_counted_at_the_real_kernels_size() -> None:
    real = rnn.FORWARD(*_layer_args(torch.randn(40, 3, 24), 48))[3]
    with FakeTensorMode():
        args = _layer_args(torch.randn(40, 3, 24), 48)
        fake = rnn.FORWARD(*args)[3]
        assert fake.untyped_storage().nbytes() == 0
        counted = real_storage_bytes(rnn.FORWARD, args, fake)
        with torch.no_grad():  # without autograd the kernel keeps no workspace
            assert real_storage_bytes(rnn.FORWARD, args, rnn.FORWARD(*args)[3]) == 0
    assert counted == real.untyped_storage().nbytes() > 0


def test_cudnn_reserve_is_estimated_for_a_fake_cudnn_call() -> None:
    layer = rnn._Layer(
        mode=2, steps=10, batch=4, hidden=32, output=32, layers=2, directions=2, element=4
    )
    assert rnn.cudnn_reserve_bytes(layer) == 2 * 2 * 11 * 4 * (11 * 32) * 4
    reserve = torch.empty(0, dtype=torch.uint8)
    x = torch.empty(10, 4, 16)
    args = (x, [], 4, None, None, None, 2, 32, 0, 2, False, 0.0, True, True, [], None)
    assert real_storage_bytes(rnn.CUDNN, args, reserve) == rnn.cudnn_reserve_bytes(layer)


def test_an_lstm_steps_peak_is_predicted_within_3_percent() -> None:
    plan = ckptplan.solve(STACK, budget="100%", solver="none")
    check = ckptplan.verify(STACK, plan, repeats=1)
    assert abs(check.predicted_peak_bytes - check.measured_peak_bytes) <= (
        0.03 * check.measured_peak_bytes
    )


@pytest.mark.parametrize("budget", ["70%", "50%"])
def test_a_stack_of_lstms_is_planned_within_budget_with_exact_gradients(budget: str) -> None:
    plan = ckptplan.solve(STACK, budget=budget)
    assert plan.regions, "the budget is below the unchecked peak: some layer is checkpointed"
    check = ckptplan.verify(STACK, plan, repeats=1)
    assert check.measured_peak_bytes <= plan.budget.bytes
    assert check.max_grad_abs_diff <= 1e-6
    assert abs(check.predicted_peak_bytes - check.measured_peak_bytes) <= (
        0.03 * check.measured_peak_bytes
    )


def test_one_multi_layer_lstm_named_as_a_block_is_predicted_right() -> None:
    torch.manual_seed(0)
    model, batch = small_lstm.OneLSTM(), small_lstm.example_inputs()
    plan = ckptplan.solve(model, batch, budget="100%", solver="none", blocks="lstm")
    check = ckptplan.verify(model, plan, batch, repeats=1)
    assert abs(check.predicted_peak_bytes - check.measured_peak_bytes) <= (
        0.03 * check.measured_peak_bytes
    )


def test_one_multi_layer_lstm_is_planned_layer_by_layer() -> None:
    """The layers of one ``nn.LSTM(num_layers=4)`` are units: a plan below what checkpointing
    the LSTM whole gives holds, with exact gradients."""
    torch.manual_seed(0)
    model, batch = small_lstm.OneLSTM(), small_lstm.example_inputs()
    whole = ckptplan.solve(model, batch, budget="100%", solver="none", blocks="lstm")
    profile = ckptplan.profile(model, batch)
    assert [b.path for b in profile.blocks] == [f"lstm.layers.{k}" for k in range(4)]
    plan = ckptplan.solve(model, batch, budget="60%")
    assert plan.regions and plan.predicted.peak_bytes < whole.predicted.peak_bytes
    check = ckptplan.verify(model, plan, batch, repeats=1)
    assert check.measured_peak_bytes <= plan.budget.bytes
    assert check.max_grad_abs_diff == 0
    assert abs(check.predicted_peak_bytes - check.measured_peak_bytes) <= (
        0.03 * check.measured_peak_bytes
    )


def test_a_multi_layer_lstm_with_dropout_is_told_how_to_split_it() -> None:
    """Dropout between layers is cuDNN's own on a GPU, which a split run cannot repeat."""
    torch.manual_seed(0)
    model, batch = small_lstm.OneLSTM(), small_lstm.example_inputs()
    model.lstm.dropout = 0.1
    with pytest.raises(CkptplanError, match=r"dropout=0.1 between layers.*one-layer nn\.LSTMs"):
        ckptplan.profile(model, batch)


def test_a_plan_for_a_gpu_counts_cudnns_reserve() -> None:
    """Profiled for a GPU, each layer keeps cuDNN's reserve (estimated) instead of oneDNN's
    workspace."""
    width, steps = small_lstm.WIDTH, small_lstm.SEQ
    reserve = rnn.cudnn_reserve_bytes(rnn._Layer(2, steps, 8, width, width, 1, 1, 4))
    cpu = ckptplan.profile(STACK).blocks
    gpu = ckptplan.profile(STACK, target="h100").blocks
    for on_cpu, on_gpu in zip(cpu, gpu, strict=True):
        assert on_gpu.saved_bytes >= reserve
        assert on_gpu.saved_bytes != on_cpu.saved_bytes


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lstm_stack", "lstm_lm"])
def test_the_zoos_lstm_language_models_are_predicted_and_fit(name: str) -> None:
    path = ROOT / "sample_models" / "zoo" / f"{name}.py"
    blocks = "lstm" if name == "lstm_lm" else None
    plan = ckptplan.solve(path, budget="100%", solver="none", blocks=blocks)
    check = ckptplan.verify(path, plan, repeats=1)
    assert abs(check.predicted_peak_bytes - check.measured_peak_bytes) <= (
        0.03 * check.measured_peak_bytes
    )
    plan = ckptplan.solve(path, budget="70%")  # lstm_lm: its one LSTM's layers are the units
    check = ckptplan.verify(path, plan, repeats=1)
    assert check.measured_peak_bytes <= plan.budget.bytes
    assert check.max_grad_abs_diff <= 1e-6


@pytest.mark.slow  # a minute: the CPU runs a GRU as ops per step, thousands of them
def test_a_stack_of_grus_is_planned_and_predicted_within_3_percent() -> None:
    """Fake tensors size the GRU's ops per step as they are: nothing to correct."""
    torch.manual_seed(0)
    model, batch = small_lstm.StackedGRU(), small_lstm.example_inputs(batch_size=4)
    plan = ckptplan.solve(model, batch, budget="85%")
    check = ckptplan.verify(model, plan, batch, repeats=1)
    assert check.measured_peak_bytes <= plan.budget.bytes
    assert check.max_grad_abs_diff <= 1e-6
    assert abs(check.predicted_peak_bytes - check.measured_peak_bytes) <= (
        0.03 * check.measured_peak_bytes
    )
