"""``benchmarks/kernel_prices.py`` reads inductor's generated code as inductor runs it: every
call of every graph a step runs is timed, in the order the code lists it, and priced."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # it solves and compiles a model twice


def test_every_call_of_a_compiled_step_is_timed_and_priced(monkeypatch) -> None:
    path = ROOT / "benchmarks" / "kernel_prices.py"
    spec = importlib.util.spec_from_file_location("kernel_prices", path)
    kernel_prices = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "kernel_prices", kernel_prices)  # for its dataclasses
    spec.loader.exec_module(kernel_prices)
    torch._dynamo.reset()
    row = kernel_prices.run_model(ROOT / "sample_models" / "gpt.py", ["60%"], steps=2)
    torch._dynamo.reset()
    assert row["graphs_unmatched"] == 0, "a step ran calls the parsed code does not list"
    assert set(row["classes"]) == {"pointwise", "library"}
    for figures in row["classes"].values():
        assert figures["measured_s"] > 0 and figures["priced_s"] > 0
    unchecked, planned = row["entries"]["unchecked"], row["entries"]["dp@60%"]
    assert unchecked["overhead_measured"] == 0 == unchecked["overhead_priced"]
    assert planned["graphs_priced_s"] > 0 and planned["forward_backward_wall_s"] > 0
    assert row["priced_unnamed_s"] < 0.05 * unchecked["graphs_priced_s"]
