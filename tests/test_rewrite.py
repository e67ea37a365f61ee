"""``ckptplan.rewrite``: the checkpointed GraphModule and the standalone file written from it.

On every sample model a plan with a multi-block region, a single-block region and (where the
model has one) a nested region or a selective policy is rewritten; the in-memory module and
the module built from the written file must have the original's state_dict keys and give its
loss and gradients in train() (dropout replayed from the same seed) and then in eval() (with
the BatchNorm statistics that train step left). The plans are made directly (``solve`` would
profile each model for nothing: only the regions matter here).
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy

import ckptplan
import ckptplan.rewriting.graph
from ckptplan.applying import policy as policy_runtime
from ckptplan.errors import CkptplanError
from ckptplan.fingerprint import model_fingerprint
from ckptplan.loading import ModelFile, call_model, load_model_file
from ckptplan.values.plan import Plan
from ckptplan.values.policy_types import Choice
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
    """A rewritten parameter's path in the original model: the same (rewrite keeps paths)."""
    return name


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
def test_rewritten_sample_models_keep_the_state_dict_and_train_and_evaluate_alike(
    name, tmp_path
) -> None:
    model_file = load_model_file(ROOT / "sample_models" / f"{name}.py")
    torch.manual_seed(0)
    model = model_file.build()
    torch.manual_seed(1)
    inputs = model_file.inputs(1)
    reference = copy.deepcopy(model)
    module = ckptplan.rewrite(model, plan_for(model, REGIONS[name]))
    assert isinstance(module, torch.fx.GraphModule)
    loaded = written(module, tmp_path, name)
    built = loaded.build_model()
    for candidate in (module, built):
        assert list(candidate.state_dict()) == list(reference.state_dict())
        assert candidate.load_state_dict(reference.state_dict()) == ([], [])

    for training in (True, False):
        expected_loss, expected = step(model_file, reference.train(training), inputs)
        for candidate in (module, built):
            loss, grads = step(model_file, candidate.train(training), inputs)
            assert loss == pytest.approx(expected_loss, abs=1e-6), training
            assert grads.keys() == expected.keys()
            for n, grad in grads.items():
                assert torch.allclose(grad, expected[n], atol=1e-6, rtol=0), (training, n)
    assert not any(p.is_meta for p in built.parameters())
    assert {n for n, _ in built.named_parameters()} == {n for n, _ in module.named_parameters()}

    source = Path(loaded.__file__).read_text()
    for region in REGIONS[name]:
        assert " + ".join(region["modules"]) in source
    top = len(REGIONS[name])
    assert source.count("torch.utils.checkpoint.checkpoint(") == top + sum(
        len(r.get("children", ())) for r in REGIONS[name]
    )


def test_the_written_policy_decides_as_applys_at_every_op_call(tmp_path, monkeypatch) -> None:
    """For one plan, the policy in the written file (copied from ``ckptplan.applying.policy``)
    and the one ``ckptplan.apply`` runs make the same choice at every op call of a selective
    region: the plan's ``Policy.choice``."""
    model_file = load_model_file(ROOT / "sample_models" / "gpt.py")
    torch.manual_seed(0)
    model = model_file.build()
    plan = plan_for(model, REGIONS["gpt"])
    loaded = written(ckptplan.rewrite(copy.deepcopy(model), plan), tmp_path, "gpt_policy")
    assert "import ckptplan" not in Path(loaded.__file__).read_text()
    inputs = model_file.inputs(1)

    def decisions(namespace: Any, candidate: torch.nn.Module) -> list[tuple[str, bool, Any]]:
        made: list[tuple[str, bool, Any]] = []
        contexts = namespace.create_selective_checkpoint_contexts

        def recording(decide: Any) -> Any:
            def recorded(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
                made.append((str(func), ctx.is_recompute, decide(ctx, func, *args, **kwargs)))
                return made[-1][2]

            return contexts(recorded)

        monkeypatch.setattr(namespace, "create_selective_checkpoint_contexts", recording)
        step(model_file, candidate, inputs)
        return made

    rewritten = decisions(loaded, loaded.build_model())
    applied = decisions(policy_runtime, ckptplan.apply(copy.deepcopy(model), plan))
    assert rewritten == applied
    (policy,) = [r.policy for r in plan.regions if r.policy is not None]
    calls: Counter[tuple[str, bool]] = Counter()
    expected = []
    for op, recompute, _ in applied:
        choice = policy.choice(op, calls[op, recompute])
        calls[op, recompute] += 1
        keep = CheckpointPolicy.MUST_SAVE if choice is Choice.SAVE else None
        expected.append((op, recompute, keep or CheckpointPolicy.PREFER_RECOMPUTE))
    assert applied == expected
    assert {c for *_, c in applied} == {
        CheckpointPolicy.MUST_SAVE,
        CheckpointPolicy.PREFER_RECOMPUTE,
    }


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
    for path in ("blocks.1.fc", "blocks.2.fc", "blocks.3.fc"):
        module.get_submodule(path).register_forward_hook(
            lambda *_, path=path: calls.__setitem__(path, calls.get(path, 0) + 1)
        )
    step(model_file, module, model_file.inputs(4))
    assert calls == {"blocks.1.fc": 2, "blocks.2.fc": 2, "blocks.3.fc": 1}


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


class Block(torch.nn.Module):
    """A functional dropout that reads ``self.training``, a buffer outside the state_dict and a
    parameter the forward never uses."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.register_buffer("scale", torch.full((8,), 0.5), persistent=False)
        self.unused = torch.nn.Parameter(torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.dropout(self.norm(self.fc(x)), 0.5, self.training)
        return x + y * self.scale


class BlockNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("offset", torch.ones(8))
        self.blocks = torch.nn.ModuleList([Block(), Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x) + self.offset  # a buffer of the model's own, in the first region
        return x.square().mean()


def test_each_module_reads_its_own_mode_and_every_key_is_kept(tmp_path) -> None:
    torch.manual_seed(0)
    model = BlockNet()
    reference = copy.deepcopy(model)
    regions = [{"modules": ["blocks.0", "blocks.1"]}, {"modules": ["blocks.2"]}]
    module = ckptplan.rewrite(model, plan_for(model, regions))
    built = written(module, tmp_path, "blocks").build_model()
    keys = list(reference.state_dict())
    assert "blocks.0.unused" in keys and "blocks.0.scale" not in keys
    x = torch.randn(16, 8)
    # train(), eval(), then train() with one block in eval(): F.dropout reads its block's flag
    for training, evaluated in ((True, ()), (False, ()), (True, (1,))):
        results = []
        for candidate in (reference, module, built):
            assert list(candidate.state_dict()) == keys
            candidate.train(training)
            for k in evaluated:
                candidate.get_submodule(f"blocks.{k}").eval()
            candidate.zero_grad(set_to_none=True)
            torch.manual_seed(3)
            loss = candidate(x)
            loss.backward()
            grads = {n: p.grad for n, p in candidate.named_parameters() if p.grad is not None}
            results.append((loss.item(), grads, dict(candidate.named_buffers())))
        (expected_loss, expected, buffers), *others = results
        for loss, grads, got in others:
            assert loss == pytest.approx(expected_loss, abs=1e-6), (training, evaluated)
            assert grads.keys() == expected.keys()
            assert all(torch.allclose(grads[n], g, atol=1e-6, rtol=0) for n, g in expected.items())
            assert got.keys() == buffers.keys()
            assert all(torch.equal(got[n], b) for n, b in buffers.items()), "norm statistics"


class DropPath(torch.nn.Module):
    """Takes another code path in eval(), as timm's DropPath does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        return x * (torch.rand_like(x[:, :1]) > 0.5).to(x.dtype) * 2


class Residual(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.drop = DropPath()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc(x))


class PathNet(torch.nn.Module):
    def __init__(self, branch: bool = False) -> None:
        super().__init__()
        self.branch = branch
        self.blocks = torch.nn.Sequential(Residual(), Residual(), Residual())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(x)
        if self.branch and self.training:
            x = x * 2
        return x.square().mean()


def test_a_module_that_branches_on_its_mode_stays_a_module(tmp_path) -> None:
    torch.manual_seed(0)
    model = PathNet()
    module = ckptplan.rewrite(model, plan_for(model, [{"modules": ["blocks.0", "blocks.1"]}]))
    assert module.ckptplan_leaves >= {"blocks.0.drop", "blocks.1.drop", "blocks.2.drop"}
    x = torch.randn(16, 8)
    for training in (True, False):
        losses = []
        for candidate in (model, module):
            candidate.train(training)
            torch.manual_seed(3)
            losses.append(candidate(x).item())
        assert losses[0] == pytest.approx(losses[1], abs=1e-6), training
    with pytest.raises(CkptplanError, match=r"DropPath is not a torch module.*eval\(\)") as info:
        ckptplan.rewrite.save(module, tmp_path / "path_ckpt.py")
    assert "\n" not in str(info.value)


def test_a_model_whose_own_forward_branches_on_its_mode_points_to_apply() -> None:
    model = PathNet(branch=True)
    with pytest.raises(CkptplanError, match=r"PathNet.forward takes another path.*apply") as info:
        ckptplan.rewrite(model, plan_for(model, [{"modules": ["blocks.0"]}]))
    assert "\n" not in str(info.value)
    assert model.training and all(m.training for m in model.modules()), "modes put back"


def test_the_rewrite_command_writes_a_module_that_trains(tmp_path) -> None:
    from click.testing import CliRunner

    from ckptplan.cli.main import cli

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


def test_a_sequential_root_rewrites_and_saves(tmp_path: Path) -> None:
    """A Sequential's children are attributes ``0``, ``1``...: no Python names."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()) for _ in range(4)]
    )
    plan = plan_for(model, [{"modules": ["1"]}, {"modules": ["2", "3"]}])
    module = ckptplan.rewrite(copy.deepcopy(model), plan)
    ckptplan.rewrite.save(module, tmp_path / "seq_ckpt.py")
    spec = importlib.util.spec_from_file_location("seq_ckpt", tmp_path / "seq_ckpt.py")
    written = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(written)
    x = torch.randn(4, 8, requires_grad=True)
    for candidate in (module, written.build_model()):
        assert list(candidate.state_dict()) == list(model.state_dict())
        torch.testing.assert_close(candidate(x), model(x), rtol=0, atol=0)
