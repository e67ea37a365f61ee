"""``benchmarks/gpu_check.py`` runs its CPU self-test: the same code the GPU check runs."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)


def test_the_gpu_check_self_test_plans_measures_and_writes_its_results(monkeypatch) -> None:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", gpu_check)  # for its dataclasses
    spec.loader.exec_module(gpu_check)
    result = gpu_check.run(self_test=True)
    assert [r["model"] for r in result["models"]] == ["gpt", "hf_llama"]
    assert result["all_within_budget"] and result["all_grads_match"]
    assert result["max_prediction_error"] <= 0.03
    llama = result["models"][1]
    assert llama["hf_every_layer"]["allocated_bytes"] >= llama["least_bytes"]
    fitted = result["fit"]
    assert fitted["within_budget"] and fitted["grads_match"] and fitted["largest"] >= 1
    json.dumps(result)
