"""Hugging Face Llama, whose attention routes ``apply_rotary_pos_emb`` through the ``kernels``
package's hub layer: planned regions compile into as many graphs as the unplanned model, with
the unplanned gradients, and a kernelized copy of the hub function still runs compiled.
"""

from __future__ import annotations

import copy
import pickle
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch._dynamo

import ckptplan
from ckptplan.loading import ModelFile, call_model, load_model_file
from tests.conftest import MODELS
from tests.test_rewrite import plan_for

pytest.importorskip("kernels")

REGIONS = [
    {"modules": ["model.layers.0", "model.layers.1"]},
    {"modules": ["model.layers.2"], "policy": {"save": ["aten.mm.default#0"]}},
]


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def model_file() -> ModelFile:
    return load_model_file(MODELS / "hf_llama.py")


def built(model_file: ModelFile) -> tuple[torch.nn.Module, torch.nn.Module, Any]:
    """The unplanned model in eval mode (no dropout to draw), a planned copy, and inputs."""
    torch.manual_seed(0)
    reference = model_file.build().eval()
    planned = ckptplan.apply(copy.deepcopy(reference), plan_for(reference, REGIONS))
    return reference, planned, model_file.inputs(2)


def loss_of(model_file: ModelFile, model: Any, inputs: Any) -> torch.Tensor:
    return model_file.loss(call_model(model, inputs))


def test_planned_llama_compiles_into_the_unplanned_graphs(model_file) -> None:
    reference, planned, inputs = built(model_file)
    plain = torch._dynamo.explain(lambda i: loss_of(model_file, reference, i))(inputs)
    torch._dynamo.reset()
    checked = torch._dynamo.explain(lambda i: loss_of(model_file, planned, i))(inputs)
    assert plain.graph_break_count == 0
    assert (checked.graph_count, checked.graph_break_count) == (plain.graph_count, 0)


@pytest.mark.slow  # the default tier keeps one case of each behaviour (README)
def test_planned_llama_compiled_has_the_unplanned_gradients(model_file) -> None:
    reference, planned, inputs = built(model_file)
    loss_of(model_file, reference, inputs).backward()
    loss_of(model_file, torch.compile(planned, backend="aot_eager"), inputs).backward()
    for (name, want), got in zip(reference.named_parameters(), planned.parameters(), strict=True):
        assert torch.allclose(want.grad, got.grad, atol=1e-6, rtol=0), name


@pytest.mark.slow
def test_a_kernelized_hub_copy_still_runs_compiled(model_file) -> None:
    """``kernels.kernelize`` replaces a copy's ``forward``; compiled, the planned layer must
    still route the hub function to it (here a copy that doubles its outputs)."""
    _, planned, inputs = built(model_file)
    attention = planned.get_submodule("model.layers.2.self_attn")
    (copy_,) = attention.__dict__["_kernel_funcs"].values()
    calls: list[int] = []

    def doubled(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        q, k = type(self).forward(self, *args, **kwargs)
        return 2 * q, 2 * k

    copy_.forward = types.MethodType(doubled, copy_)
    eager = loss_of(model_file, planned, inputs)
    compiled = loss_of(model_file, torch.compile(planned, backend="aot_eager"), inputs)
    assert len(calls) == 2  # once eager, once traced
    assert torch.allclose(eager, compiled, atol=1e-5, rtol=0)


def test_copies_of_a_planned_llama_resolve_their_own_layers(model_file) -> None:
    _, planned, _ = built(model_file)
    for twin in (copy.deepcopy(planned), pickle.loads(pickle.dumps(planned))):
        attention = twin.get_submodule("model.layers.2.self_attn")
        assert attention.forward.module is attention
