"""Pricing a compiled graph kernel by kernel (``ckptplan.stepping.graphcost``): a value inductor
fuses into its reader is neither written nor read back, one a library kernel reads is both, a
fused kernel reads each input once, and a matmul pays its FLOPs, on the device's roofline
(the chain's discount for fusion is not taken again)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ckptplan.devices import get_device
from ckptplan.stepping.graphcost import graph_seconds

CPU = get_device("cpu", compiled=True)
ROOFLINE = get_device("cpu")
N = 64
BYTES = N * N * 4


def priced(fn, *shapes: tuple[int, ...]) -> float:
    graph = make_fx(fn, tracing_mode="fake")(*(torch.ones(s) for s in shapes))
    return graph_seconds(graph, CPU)


def memory(nbytes: int) -> float:
    return ROOFLINE.op_time("memory", 0.0, nbytes, half=False)


def test_a_pointwise_op_fused_into_its_reader_moves_only_its_input() -> None:
    # relu runs inside sum's kernel, which reads x from memory and writes the sum.
    expected = memory(BYTES + 4) + memory(0)
    assert priced(lambda x: torch.relu(x).sum(), (N, N)) == pytest.approx(expected, rel=1e-12)


def test_a_fused_kernel_reads_each_input_once() -> None:
    one = priced(lambda x: torch.relu(x).sum(), (N, N))
    three = priced(lambda x: (torch.relu(x) * torch.sigmoid(x)).sum(), (N, N))
    assert three == pytest.approx(one, rel=1e-9)


def test_a_value_a_matmul_reads_is_written_and_read_back() -> None:
    fused = priced(lambda x, w: torch.relu(x).sum() + w.sum(), (N, N), (N, N))
    unfused = priced(lambda x, w: (torch.relu(x) @ w).sum(), (N, N), (N, N))
    matmul = ROOFLINE.op_time("matmul", 2.0 * N**3, 3 * BYTES, half=False)
    relu_written = memory(2 * BYTES)
    assert unfused == pytest.approx(relu_written + matmul + memory(BYTES + 4), rel=1e-12)
    assert unfused > fused


def test_views_cost_nothing() -> None:
    plain = priced(lambda x: torch.relu(x).sum(), (N, N))
    viewed = priced(lambda x: torch.relu(x.view(N * N)).sum(), (N, N))
    assert viewed == plain
