"""``benchmarks/kernel_prices.py`` reads inductor's generated code as inductor runs it: every
call of every graph a step runs is timed, in the order the code lists it, and priced, and a
plan's difference from the unchecked step is told part by part."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

import ckptplan
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # it solves and compiles a model twice


def test_every_call_of_a_compiled_step_is_timed_and_priced(monkeypatch, tmp_path) -> None:
    path = ROOT / "benchmarks" / "kernel_prices.py"
    spec = importlib.util.spec_from_file_location("kernel_prices", path)
    kernel_prices = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "kernel_prices", kernel_prices)  # for its dataclasses
    spec.loader.exec_module(kernel_prices)
    model = ROOT / "sample_models" / "gpt.py"
    ckptplan.solve(model, budget="60%", solver="dp").save(tmp_path / "dp60.json")
    torch._dynamo.reset()
    row = kernel_prices.run_model(model, [], steps=2, plans=[tmp_path / "dp60.json"])
    torch._dynamo.reset()
    assert row["graphs_unmatched"] == 0, "a step ran calls the parsed code does not list"
    assert set(row["classes"]) == {"pointwise", "library"}
    for figures in row["classes"].values():
        assert figures["measured_s"] > 0 and figures["priced_s"] > 0
    unchecked, planned = row["entries"]["unchecked"], row["entries"]["dp60"]
    assert unchecked["overhead_measured"] == 0 == unchecked["overhead_priced"]
    assert planned["graphs_priced_s"] > 0 and planned["forward_backward_wall_s"] > 0
    # The plan's difference from the unchecked step, part by part, adds up to the whole.
    parts = planned["difference_s"]
    assert {"forward pointwise", "backward pointwise"} <= parts.keys()
    for key in ("measured", "priced"):
        whole = planned[f"graphs_{key}_s"] - unchecked[f"graphs_{key}_s"]
        assert sum(p[key] for p in parts.values()) == pytest.approx(whole, abs=1e-9)
    # The plan recomputes in backward: its backward runs more pointwise work.
    assert parts["backward pointwise"]["priced"] > 0
    assert row["priced_unnamed_s"] < 0.05 * unchecked["graphs_priced_s"]
