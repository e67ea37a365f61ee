"""Graphs and graph breaks of a compiled plan: the fake compiled run counts them, and verify
fails a plan whose compiled step has more graphs or graph breaks than the unchecked one.

The model's middle block writes to a global object in forward, which dynamo traces in the
unchecked model (one graph) but refuses inside a checkpoint region: a break the plan adds.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from ckptplan.cli.main import cli
from ckptplan.loading import load_model_file
from ckptplan.stepping.fakerun import compiled_fake_run
from ckptplan.values.plan import Plan
from tests.conftest import MODELS
from tests.test_rewrite import plan_for

pytestmark = pytest.mark.slow  # compiles with inductor (README: the default tier keeps one case)


class Note:
    last: torch.Tensor | None = None


NOTE = Note()


class Noted(nn.Module):
    """A block that keeps its input on a global object (as a hub layer sets its routing)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        NOTE.last = x  # a new value each call, as the hub layer's routing table is
        return torch.tanh(self.linear(x))


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 32), Noted(), nn.Linear(32, 32), nn.Tanh())


def example_inputs(batch_size: int = 16) -> torch.Tensor:
    return torch.randn(batch_size, 32)


class Configured(nn.Module):
    """Sets an attribute at its first call, as transformers' loss sets its config's problem
    type: dynamo compiles the step again at the second call."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 32)
        self.kind: str | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind is None:
            self.kind = "set"
        return torch.tanh(self.linear(x))


def build_configured() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 32), Configured(), nn.Linear(32, 32), nn.Tanh())


SPEC = "tests.test_compile_graph_count:build_model"


def compiled_plan(regions: list[dict[str, Any]], model: nn.Module | None = None) -> Plan:
    data = plan_for(model or build_model(), regions).to_json()
    data["settings"] = {**data["settings"], "compiled": True}
    return Plan.from_json(data)


def test_the_compiled_fake_run_counts_the_graphs_a_region_breaks_into() -> None:
    workload = load_model_file(SPEC)
    _, plain = compiled_fake_run(workload, compiled_plan([]))
    _, clean = compiled_fake_run(workload, compiled_plan([{"modules": ["2"]}]))
    _, broken = compiled_fake_run(workload, compiled_plan([{"modules": ["1"]}]))
    assert (plain.compiled_graphs, plain.graph_breaks) == (1, 0)
    assert (clean.compiled_graphs, clean.graph_breaks) == (1, 0)
    assert broken.graph_breaks >= 1  # the loop then runs eagerly, with fewer graphs or more
    assert broken.to_json()["compiled_graphs"] == broken.compiled_graphs


def test_verify_fails_a_compiled_plan_that_adds_graphs(tmp_path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(compiled_plan([{"modules": ["1"]}]).to_json()))
    result = CliRunner().invoke(cli, ["verify", SPEC, str(plan), "--on", "cpu", "--json"])
    assert result.exit_code == 1, result.output
    figures = json.loads(result.stdout)
    assert figures["graphs_match"] is False
    compiled = figures["compiled"]
    assert compiled["unchecked_graphs"] == 1 and compiled["unchecked_graph_breaks"] == 0
    assert compiled["graph_breaks"] >= 1
    (line,) = [s for s in result.stderr.splitlines() if "graph" in s]
    assert "the plan adds graph breaks" in line


def test_solve_says_when_its_plan_adds_graph_breaks(tmp_path) -> None:
    """Every block in a region (``full``): the noting block's breaks, beside the unchecked
    step's none, from the search's own fake runs."""
    plan = tmp_path / "plan.json"
    args = ["solve", SPEC, "--budget", "1.0", "--solver", "full", "--compile", "-o", str(plan)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "under torch.compile the plan adds" in " ".join(result.output.split())
    partition = Plan.load(plan).predicted.compiled_partition
    assert partition["unchecked_graph_breaks"] == 0 < partition["graph_breaks"]


def test_the_partition_prices_the_graphs_the_measured_step_runs() -> None:
    """A step compiled again at its second call runs the second graphs only: they are priced
    once, as the step that never recompiles is."""
    _, plain = compiled_fake_run(load_model_file(SPEC), compiled_plan([]))
    configured = load_model_file("tests.test_compile_graph_count:build_configured")
    _, again = compiled_fake_run(configured, compiled_plan([], build_configured()))
    assert (plain.compiled_graphs, again.compiled_graphs) == (1, 2)
    assert plain.seconds > 0
    assert again.seconds == pytest.approx(plain.seconds, rel=0.1)  # not twice it


def test_a_hugging_face_decoder_compiles_to_one_graph_in_the_fake_run() -> None:
    """transformers asks whether the position ids pack sequences; traced, it answers itself
    (it builds the mask), in the real compiled step and the fake one alike. Answered by the
    fake run, as an eager fake step is, the question broke the graph in every step."""
    pytest.importorskip("transformers")
    workload = load_model_file(MODELS / "hf_llama.py")
    _, plain = compiled_fake_run(workload, compiled_plan([], workload.build()))
    assert (plain.compiled_graphs, plain.graph_breaks) == (1, 0)
