"""Hugging Face models through profile -> solve -> verify -> apply, as a user would run them.

Four tiny models built from configs (``tests/models/hf_*.py``: GPT-2, Llama, BERT, ViT), with
dropout on, keyword inputs and ``labels``. Each is solved at budgets between the peak of full
checkpointing and the unchecked peak; the measured peak must fit the budget and match the
prediction, and the checkpointed gradients must equal the unchecked ones (same RNG seed).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest

pytest.importorskip("transformers")

import torch

import ckptplan
from ckptplan.loading import load_model_file
from ckptplan.values.plan import Plan
from tests.conftest import MODELS

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)

# model file stem -> the class of its layers; their paths move between transformers versions
# (ViT's are ``vit.encoder.layer.*`` in 4.x and ``vit.layers.*`` in 5.x)
LAYER_CLASSES = {
    "hf_gpt2": "GPT2Block",
    "hf_llama": "LlamaDecoderLayer",
    "hf_bert": "BertLayer",
    "hf_vit": "ViTLayer",
}
NAMES = sorted(LAYER_CLASSES)
N_LAYERS = 4
POSITIONS = (0.25, 0.75)
"""Budgets as positions between the full-checkpoint peak (0) and the unchecked peak (1)."""


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """These ops are tiny: a second intra-op thread gains nothing, and on a busy two-core
    machine its spin-waits make a step up to ten times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@functools.cache
def layer_paths(name: str) -> tuple[str, ...]:
    model = load_model_file(MODELS / f"{name}.py").build()
    return tuple(p for p, m in model.named_modules() if type(m).__name__ == LAYER_CLASSES[name])


@functools.cache
def bounds(name: str) -> tuple[int, int]:
    """Predicted peaks of full checkpointing and of no checkpointing."""
    full = ckptplan.solve(MODELS / f"{name}.py", budget="1.0", solver="full")
    return full.predicted.peak_bytes, full.baselines["none"]["peak_bytes"]


@functools.cache
def budget_and_plan(name: str, position: float) -> tuple[int, Plan]:
    low, high = bounds(name)
    budget = int(low + position * (high - low))
    return budget, ckptplan.solve(MODELS / f"{name}.py", budget=str(budget))


@pytest.mark.parametrize("name", NAMES)
def test_profile_finds_the_layers(name: str) -> None:
    profile = ckptplan.profile(MODELS / f"{name}.py")
    assert len(layer_paths(name)) == N_LAYERS
    assert tuple(b.path for b in profile.blocks) == layer_paths(name)


@pytest.mark.parametrize(
    "position", [POSITIONS[0], pytest.param(POSITIONS[1], marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("name", NAMES)
def test_plans_fit_their_budget_and_keep_gradients(name: str, position: float) -> None:
    budget, plan = budget_and_plan(name, position)
    assert plan.regions, "a budget under the unchecked peak needs some checkpointing"
    result = ckptplan.verify(MODELS / f"{name}.py", plan, repeats=1)
    assert result.measured_peak_bytes <= budget
    assert result.prediction_error <= 0.05
    assert result.max_grad_abs_diff <= 1e-6


@pytest.mark.parametrize("name", NAMES)
def test_apply_wraps_the_planned_layers(name: str) -> None:
    _, plan = budget_and_plan(name, POSITIONS[0])
    model = ckptplan.apply(load_model_file(MODELS / f"{name}.py").build(), plan)
    regions = model.ckptplan_applied.regions
    assert regions == tuple(r.modules for r in plan.regions)
    assert {path for region in regions for path in region} <= set(layer_paths(name))


def test_a_model_object_goes_through_the_python_api() -> None:
    from tests.models import hf_llama

    torch.manual_seed(0)
    model, inputs = hf_llama.build_model(), hf_llama.example_inputs()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    plan = ckptplan.solve(model, inputs, budget="0.7")
    result = ckptplan.verify(model, plan, inputs, repeats=1)
    assert result.measured_peak_bytes <= plan.budget.bytes
    assert result.max_grad_abs_diff <= 1e-6
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
