"""``ckptplan.rewrite``: the checkpointed GraphModule and the standalone file written from it.

On every sample model a plan with a multi-block region, a single-block region and (where the
model has one) a nested region or a selective policy is rewritten; the in-memory module and
the module built from the written file must give the original's loss and gradients, with
dropout replayed from the same seed. The plans are made directly (``solve`` would profile
each model for nothing: only the regions matter here).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import ckptplan
import ckptplan.rewrite
from ckptplan.errors import CkptplanError
from ckptplan.fingerprint import model_fingerprint
from ckptplan.loading import ModelFile, call_model, load_model_file
from ckptplan.plan import Plan
from tests.conftest import MODELS, ROOT


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Small ops: a second intra-op thread only spin-waits on a busy two-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


REGIONS: dict[str, list[dict[str, Any]]] = {
    "mlp": [
        {"modules": ["blocks.0", "blocks.1", "blocks.2"], "children": [{"modules": ["blocks.0"]}]},
        {"modules": ["blocks.5"]},
    ],
    "gpt": [
        {"modules": ["blocks.1", "blocks.2"]},
        {"modules": ["blocks.4"], "policy": {"save": ["aten.addmm.default#0", "aten.mm.default"]}},
    ],
    "resnet": [
        {"modules": ["blocks.0", "blocks.1"]},
        {"modules": ["blocks.3"], "children": [{"modules": ["blocks.3.conv1"]}]},
    ],
    "unet": [{"modules": ["encoder.0", "encoder.1"]}, {"modules": ["encoder.3"]}],
    "vit": [{"modules": ["blocks.0", "blocks.1", "blocks.2"]}, {"modules": ["blocks.6"]}],
}


def plan_for(model: torch.nn.Module, regions: list[dict[str, Any]], name: str = "m") -> Plan:
    return Plan.from_json(
        {
            "schema": "ckptplan.plan/1",
            "model": name,
            "fingerprint": model_fingerprint(model),
            "inputs": None,
            "budget": {"text": "1.0", "bytes": 10**9},
            "solver": "given",
            "settings": {},
            "blocks": [],
            "regions": regions,
            "predicted": {"peak_bytes": 10**9},
        }
    )


def step(model_file: ModelFile, model: torch.nn.Module, inputs: Any) -> tuple[float, dict]:
    """Loss and gradients of one seeded forward and backward."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    loss = model_file.loss(call_model(model, inputs))
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def original_name(name: str) -> str:
    """A rewritten parameter's path in the original model (regions add a prefix)."""
    return re.sub(r"^(ckpt_\w+\.)+", "", name)


def written(module: torch.fx.GraphModule, tmp_path: Path, stem: str) -> ModuleType:
    file, weights = ckptplan.rewrite.save(module, tmp_path / f"{stem}_ckpt.py")
    assert weights == tmp_path / f"{stem}_ckpt.pt"
    spec = importlib.util.spec_from_file_location(f"written_{stem}", file)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded
    spec.loader.exec_module(loaded)
    return loaded


@pytest.mark.parametrize("name", sorted(REGIONS))
def test_rewritten_sample_models_give_the_same_loss_and_gradients(name, tmp_path) -> None:
    model_file = load_model_file(ROOT / "sample_models" / f"{name}.py")
    torch.manual_seed(0)
    model = model_file.build().train()
    torch.manual_seed(1)
    inputs = model_file.inputs(1)
    plan = plan_for(model, REGIONS[name])
    expected_loss, expected = step(model_file, model, inputs)

    module = ckptplan.rewrite(model, plan)
    assert isinstance(module, torch.fx.GraphModule)
    loaded = written(module, tmp_path, name)
    built = loaded.build_model()
    for candidate in (module, built):
        loss, grads = step(model_file, candidate, inputs)
        assert loss == pytest.approx(expected_loss, abs=1e-6)
        assert {original_name(n) for n in grads} == set(expected)
        for n, grad in grads.items():
            assert torch.allclose(grad, expected[original_name(n)], atol=1e-6, rtol=0), n
    assert not any(p.is_meta for p in built.parameters())
    assert {n for n, _ in built.named_parameters()} == {n for n, _ in module.named_parameters()}

    source = Path(loaded.__file__).read_text()
    for region in REGIONS[name]:
        assert " + ".join(region["modules"]) in source
    top = len(REGIONS[name])
    assert source.count("torch.utils.checkpoint.checkpoint(") == top + sum(
        len(r.get("children", ())) for r in REGIONS[name]
    )


def test_the_written_file_keeps_tied_weights_tied(tmp_path) -> None:
    model_file = load_model_file(ROOT / "sample_models" / "gpt.py")
    model = model_file.build()
    built = written(ckptplan.rewrite(model, plan_for(model, REGIONS["gpt"])), tmp_path, "gpt")
    module = built.build_model()
    assert module.lm_head.weight is module.wte.weight


def test_checkpointed_regions_run_again_in_backward(tmp_path) -> None:
    model_file = load_model_file(ROOT / "sample_models" / "mlp.py")
    model = model_file.build()
    module = ckptplan.rewrite(model, plan_for(model, [{"modules": ["blocks.1", "blocks.2"]}]))
    calls: dict[str, int] = {}
    for path in ("ckpt_blocks_1_to_2.blocks.1.fc", "ckpt_blocks_1_to_2.blocks.2.fc", "blocks.3.fc"):
        module.get_submodule(path).register_forward_hook(
            lambda *_, path=path: calls.__setitem__(path, calls.get(path, 0) + 1)
        )
    step(model_file, module, model_file.inputs(4))
    assert calls == {
        "ckpt_blocks_1_to_2.blocks.1.fc": 2,
        "ckpt_blocks_1_to_2.blocks.2.fc": 2,
        "blocks.3.fc": 1,
    }


def test_a_model_that_does_not_trace_points_to_apply() -> None:
    model = load_model_file(MODELS / "tiny_gpt.py").build()
    with pytest.raises(CkptplanError, match=r"does not trace.*ckptplan.apply") as info:
        ckptplan.rewrite(model, plan_for(model, [{"modules": ["layers.0"]}]))
    assert "\n" not in str(info.value)


def test_rewrite_refuses_an_applied_or_another_model() -> None:
    model_file = load_model_file(ROOT / "sample_models" / "mlp.py")
    model = model_file.build()
    plan = plan_for(model, [{"modules": ["blocks.0"]}])
    other = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(CkptplanError, match="made for another model"):
        ckptplan.rewrite(other, plan)
    ckptplan.apply(model, plan)
    with pytest.raises(CkptplanError, match="rewrite the model before applying"):
        ckptplan.rewrite(model, plan)


def test_a_region_of_a_module_that_never_runs_is_an_error() -> None:
    model_file = load_model_file(ROOT / "sample_models" / "resnet.py")
    model = model_file.build()
    model.unused = torch.nn.Linear(2, 2)
    plan = plan_for(model, [{"modules": ["unused"]}])
    with pytest.raises(CkptplanError, match="runs no traced code"):
        ckptplan.rewrite(model, plan)


def test_rewrite_file_writes_the_given_weights(tmp_path) -> None:
    path = ROOT / "sample_models" / "mlp.py"
    model_file = load_model_file(path)
    torch.manual_seed(3)
    trained = model_file.build()
    torch.save(trained.state_dict(), tmp_path / "trained.pt")
    plan = plan_for(trained, [{"modules": ["blocks.2", "blocks.3"]}])
    plan.save(tmp_path / "plan.json")
    module, source, weights = ckptplan.rewrite.rewrite_file(
        path, tmp_path / "plan.json", tmp_path / "out.py", state_dict=tmp_path / "trained.pt"
    )
    assert (source, weights) == (tmp_path / "out.py", tmp_path / "out.pt")
    assert [r.modules for r in module.ckptplan_regions] == [("blocks.2", "blocks.3")]
    spec = importlib.util.spec_from_file_location("written_out", source)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    built = loaded.build_model()
    expected = trained.state_dict()
    for name, value in built.state_dict().items():
        assert torch.equal(value, expected[original_name(name)]), name


def test_rewrite_file_refuses_weights_of_another_model(tmp_path) -> None:
    path = ROOT / "sample_models" / "mlp.py"
    model = load_model_file(path).build()
    torch.save({"nope": torch.zeros(1)}, tmp_path / "other.pt")
    plan = plan_for(model, [{"modules": ["blocks.0"]}])
    with pytest.raises(CkptplanError, match="does not fit the model"):
        ckptplan.rewrite.rewrite_file(
            path, plan, tmp_path / "out.py", state_dict=tmp_path / "other.pt"
        )
    with pytest.raises(CkptplanError, match="not found"):
        ckptplan.rewrite.rewrite_file(path, plan, tmp_path / "out.py", state_dict=tmp_path / "x.pt")


class Attention(torch.nn.Module):
    """Leaves whose constructor call cannot be read back from their repr (``_leaf`` path)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        self.layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x + self.attn(x, x, x, need_weights=False)[0])


class AttentionNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.Sequential(Attention(), Attention(), Attention())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x).square().mean()


def test_torch_leaves_without_a_constructor_repr_are_rebuilt_and_the_model_is_untouched(
    tmp_path,
) -> None:
    torch.manual_seed(0)
    model = AttentionNet()
    names = [n for n, _ in model.named_modules()]
    keys = list(model.state_dict())
    module = ckptplan.rewrite(model, plan_for(model, [{"modules": ["blocks.0", "blocks.1"]}]))
    assert [n for n, _ in model.named_modules()] == names
    assert list(model.state_dict()) == keys
    built = written(module, tmp_path, "attention").build_model()
    x = torch.randn(2, 5, 16)
    model(x).backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    built(x).backward()
    for name, p in built.named_parameters():
        assert torch.allclose(p.grad, expected[original_name(name)], atol=1e-6, rtol=0), name
    assert "_leaf(torch.nn.MultiheadAttention" in Path(tmp_path / "attention_ckpt.py").read_text()


@pytest.mark.skipif(
    "rewrite" not in __import__("ckptplan.cli").cli.cli.commands,
    reason="the rewrite command is not wired into the CLI yet",
)
def test_the_rewrite_command_writes_a_module_that_trains(tmp_path) -> None:
    from click.testing import CliRunner

    from ckptplan.cli import cli

    path = ROOT / "sample_models" / "mlp.py"
    model = load_model_file(path).build()
    plan_for(model, REGIONS["mlp"]).save(tmp_path / "plan.json")
    out = tmp_path / "mlp_ckpt.py"
    arguments = ["rewrite", str(path), str(tmp_path / "plan.json"), "-o", str(out)]
    result = CliRunner().invoke(cli, arguments)
    assert result.exit_code == 0, result.output
    assert "ckpt_blocks_0_to_2" in result.output
    spec = importlib.util.spec_from_file_location("written_cli", out)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    loss, _ = step(load_model_file(path), loaded.build_model(), (torch.randn(4, 512),))
    assert loss > 0
    failed = CliRunner().invoke(
        cli, ["rewrite", str(MODELS / "tiny_gpt.py"), *arguments[2:], "--force"]
    )
    assert failed.exit_code == 2
    assert failed.output.startswith("error: ") and "ckptplan.apply" in failed.output


def test_a_hugging_face_model_points_to_apply() -> None:
    pytest.importorskip("transformers")
    model = load_model_file(MODELS / "hf_gpt2.py").build()
    layer = next(p for p, m in model.named_modules() if type(m).__name__ == "GPT2Block")
    with pytest.raises(CkptplanError, match=r"does not trace.*ckptplan\.apply"):
        ckptplan.rewrite(model, plan_for(model, [{"modules": [layer]}]))
