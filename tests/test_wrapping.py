"""Applying plans: identical gradients, real recomputation, and the refusals."""

import copy

import pytest
import torch

import ckptplan
from ckptplan.errors import CkptplanError
from ckptplan.loading import load_model_file
from ckptplan.plan import Plan, Region


@pytest.fixture(scope="module")
def plan(request) -> Plan:
    from tests.conftest import MODELS

    return ckptplan.solve(MODELS / "tiny_gpt.py", budget="1.0", solver="none", batch_size=2)


def with_regions(plan: Plan, *regions: tuple[str, ...]) -> Plan:
    return Plan.from_json({**plan.to_json(), "regions": [{"modules": list(r)} for r in regions]})


def step(model_file, model, seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(123)
    inputs = model_file.inputs(2)
    torch.manual_seed(seed)
    model_file.loss(model(*inputs)).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "regions",
    [
        [("layers.0",), ("layers.3",)],
        [("layers.0", "layers.1", "layers.2"), ("layers.3", "layers.4", "layers.5")],
        [("layers.1", "layers.2", "layers.3", "layers.4")],
    ],
)
def test_gradients_equal_the_unchecked_model_with_dropout(tiny_gpt, plan, regions) -> None:
    model_file = load_model_file(tiny_gpt)
    torch.manual_seed(0)
    reference = model_file.build().train()
    planned = ckptplan.apply(copy.deepcopy(reference), with_regions(plan, *regions))
    expected, got = step(model_file, reference), step(model_file, planned)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.allclose(expected[name], got[name], atol=1e-6, rtol=0), name
    # Different dropout masks would change gradients: the comparison can fail.
    other = step(model_file, reference, seed=1)
    assert any(not torch.allclose(expected[n], other[n]) for n in expected)


def test_checkpointed_blocks_are_recomputed_and_others_are_not(tiny_gpt, plan) -> None:
    model_file = load_model_file(tiny_gpt)
    model = model_file.build().train()
    ckptplan.apply(model, with_regions(plan, ("layers.1", "layers.2")))
    calls = {f"layers.{i}": 0 for i in range(6)}
    for i in range(6):
        name = f"layers.{i}"
        model.layers[i].mlp.register_forward_hook(
            lambda *_, name=name: calls.__setitem__(name, calls[name] + 1)
        )
    step(model_file, model)
    assert calls == {
        "layers.0": 1,
        "layers.1": 2,
        "layers.2": 2,
        "layers.3": 1,
        "layers.4": 1,
        "layers.5": 1,
    }


def test_apply_reports_what_it_wrapped(tiny_gpt, plan) -> None:
    model = load_model_file(tiny_gpt).build()
    planned = with_regions(plan, ("layers.0", "layers.1"), ("layers.4",))
    assert ckptplan.apply(model, planned) is model
    assert model.ckptplan_applied.regions == (("layers.0", "layers.1"), ("layers.4",))
    assert "2 regions" in str(model.ckptplan_applied)
    assert set(model.state_dict()) == set(load_model_file(tiny_gpt).build().state_dict())


def test_apply_refuses_to_wrap_twice(tiny_gpt, plan) -> None:
    model = load_model_file(tiny_gpt).build()
    ckptplan.apply(model, with_regions(plan, ("layers.0",)))
    with pytest.raises(CkptplanError, match="already checkpointed"):
        ckptplan.apply(model, with_regions(plan, ("layers.0",)))


def test_apply_refuses_another_model_unless_forced(tiny_gpt, plan) -> None:
    from tests.models.tiny_gpt import TinyGPT

    other = TinyGPT(width=48)
    with pytest.raises(CkptplanError, match="made for another model") as info:
        ckptplan.apply(other, with_regions(plan, ("layers.0",)))
    assert "\n" not in str(info.value)
    ckptplan.apply(other, with_regions(plan, ("layers.0",)), force=True)
    assert other.ckptplan_applied is not None


def test_a_copy_of_an_applied_model_is_independent(tiny_gpt, plan) -> None:
    model_file = load_model_file(tiny_gpt)
    torch.manual_seed(0)
    model = ckptplan.apply(model_file.build().train(), with_regions(plan, ("layers.0", "layers.1")))
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for p in clone.parameters():
            p.mul_(0.5)
    a, b = step(model_file, model), step(model_file, clone)
    assert any(not torch.allclose(a[n], b[n]) for n in a)


def test_plan_round_trips_through_json(tmp_path, plan) -> None:
    planned = with_regions(plan, ("layers.0", "layers.1"))
    planned.save(tmp_path / "plan.json")
    loaded = Plan.load(tmp_path / "plan.json")
    assert loaded == planned
    assert loaded.regions == (Region(("layers.0", "layers.1")),)


def test_a_file_that_is_not_a_plan(tmp_path) -> None:
    (tmp_path / "x.json").write_text('{"schema": "other"}')
    with pytest.raises(CkptplanError, match="not a ckptplan plan"):
        Plan.load(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("{nope")
    with pytest.raises(CkptplanError, match="not valid JSON"):
        Plan.load(tmp_path / "y.json")
