"""The roofline time model: op classes, achievable shares of peak, launch cost."""

from __future__ import annotations

import doctest

import pytest

import ckptplan
import ckptplan.devices
from ckptplan.devices import get_device

pytestmark = pytest.mark.torchfree


def test_docstring_examples() -> None:
    assert doctest.testmod(ckptplan.devices, optionflags=doctest.ELLIPSIS).failed == 0


def test_a_gpu_op_costs_at_least_its_launch_and_a_large_gemm_runs_near_its_share_of_peak() -> None:
    h100 = get_device("h100")
    assert h100.op_time("memory", 0, 64, half=True) == pytest.approx(
        h100.efficiency.launch, rel=1e-3
    )
    flops = 2 * 8192**3
    achieved = flops / h100.op_time("matmul", flops, 3 * 2 * 8192**2, half=True)
    assert achieved == pytest.approx(h100.half_flops * h100.efficiency.matmul, rel=0.01)


def test_the_h200_streams_faster_than_the_h100_at_the_same_compute() -> None:
    h100, h200 = get_device("h100"), get_device("h200")
    moved = 2**30
    assert h200.op_time("memory", 0, moved, half=True) < h100.op_time("memory", 0, moved, True)
    assert h200.op_time("matmul", 1e15, 0, half=True) == h100.op_time("matmul", 1e15, 0, True)
