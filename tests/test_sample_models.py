"""The bundled sample models honour the model-file contract and train.

Each file in ``sample_models/`` is loaded by path, as ``ckptplan solve model.py`` loads it.
The training steps run at batch size 1-2 so the whole file stays fast; the FakeTensorMode
checks use the default batch size (fake tensors do no arithmetic). ``llama7b.py`` holds 27 GB
of fp32 weights, so it is only ever built on fake tensors.
"""

from __future__ import annotations

import importlib.util
import math
import resource
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import ckptplan

MODEL_DIR = Path(__file__).resolve().parents[1] / "sample_models"

# model file stem -> the attribute holding its repeated-block chain
BLOCK_LISTS = {
    "mlp": "blocks",
    "gpt": "blocks",
    "resnet": "blocks",
    "unet": "encoder",
    "vit": "blocks",
    "llama7b": "layers",
}
NAMES = sorted(BLOCK_LISTS)
FAKE_ONLY = {"llama7b"}
"""Too large to build for real: only the contract and fake-tensor checks run on these."""
REAL_NAMES = [name for name in NAMES if name not in FAKE_ONLY]
SMALL_BATCH = 2


def load(name: str) -> ModuleType:
    path = MODEL_DIR / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"ckptplan_sample_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(mod: ModuleType, batch_size: int | None = None, seed: int = 0):
    torch.manual_seed(seed)
    model = mod.build_model()
    torch.manual_seed(seed + 1)
    inputs = mod.example_inputs() if batch_size is None else mod.example_inputs(batch_size)
    return model, inputs


def run_forward(model: torch.nn.Module, inputs):
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def input_tensors(inputs) -> list[torch.Tensor]:
    values = inputs.values() if isinstance(inputs, dict) else inputs
    return [v for v in values if isinstance(v, torch.Tensor)]


def compute_loss(mod: ModuleType, output) -> torch.Tensor:
    if hasattr(mod, "loss_fn"):
        return mod.loss_fn(output)
    if hasattr(output, "loss"):
        return output.loss
    outs = output if isinstance(output, (tuple, list)) else [output]
    return sum(o.float().sum() for o in outs if o.is_floating_point())


def block_lists(model: torch.nn.Module) -> dict[str, int]:
    """Name -> length of every ModuleList/Sequential whose children all share one class."""
    found = {}
    for name, m in model.named_modules():
        is_list = isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential))
        if is_list and len(m) >= 2 and len({type(child) for child in m}) == 1:
            found[name] = len(m)
    return found


def test_every_sample_model_is_covered():
    assert sorted(p.stem for p in MODEL_DIR.glob("*.py")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_contract(name):
    mod = load(name)
    assert mod.__doc__ and mod.__doc__.strip()
    assert callable(mod.build_model) and callable(mod.example_inputs)
    inputs = mod.example_inputs(1)
    assert isinstance(inputs, (tuple, dict))
    assert all(isinstance(t, torch.Tensor) for t in input_tensors(inputs))


@pytest.mark.parametrize("name", REAL_NAMES)
def test_training_step(name):
    mod = load(name)
    model, inputs = build(mod, SMALL_BATCH)
    model.train()
    versions = [t._version for t in input_tensors(inputs)]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    loss = compute_loss(mod, run_forward(model, inputs))
    assert loss.shape == torch.Size([])
    assert math.isfinite(loss.item())
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{pname} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{pname} has a non-finite gradient"
    opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert [t._version for t in input_tensors(inputs)] == versions, "forward mutated its inputs"


@pytest.mark.parametrize("name", REAL_NAMES)
def test_deterministic(name):
    mod = load(name)
    model_a, inputs_a = build(mod, 1)
    model_b, inputs_b = build(mod, 1)
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    assert sd_a.keys() == sd_b.keys()
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
    assert all(
        torch.equal(a, b)
        for a, b in zip(input_tensors(inputs_a), input_tensors(inputs_b), strict=True)
    )


@pytest.mark.parametrize("name", NAMES)
def test_fake_mode(name):
    mod = load(name)
    with FakeTensorMode():
        model, inputs = build(mod)  # default batch size: fake tensors cost nothing
        assert all(isinstance(p, FakeTensor) for p in model.parameters())
        assert all(isinstance(t, FakeTensor) for t in input_tensors(inputs))
        model.train()
        loss = compute_loss(mod, run_forward(model, inputs))
    assert isinstance(loss, FakeTensor)
    assert loss.shape == torch.Size([])
    assert loss.dtype.is_floating_point


@pytest.mark.parametrize("name", REAL_NAMES)
def test_block_chain_and_module_use(name):
    mod = load(name)
    model, inputs = build(mod, 1)
    model.train()

    lists = block_lists(model)
    longest = max(lists.values())
    assert [n for n, length in lists.items() if length == longest] == [BLOCK_LISTS[name]]

    for mname, m in model.named_modules():
        assert not getattr(m, "inplace", False), f"{mname} is an in-place module"

    calls: Counter[str] = Counter()
    names = {m: n for n, m in model.named_modules()}
    handles = [
        m.register_forward_hook(lambda m, args, out: calls.update([names[m]]))
        for m in model.modules()
    ]
    try:
        with torch.no_grad():
            run_forward(model, inputs)
    finally:
        for h in handles:
            h.remove()
    reused = {n: c for n, c in calls.items() if c > 1}
    assert not reused, f"modules called more than once in one forward: {reused}"
    blocks = getattr(model, BLOCK_LISTS[name])
    assert all(calls[names[b]] == 1 for b in blocks)


def test_llama7b_profiles_on_fake_tensors_without_allocating():
    """Llama-2-7B in bf16 for an H100: its 32 layers chain, and nothing is allocated."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    profile = ckptplan.profile(MODEL_DIR / "llama7b.py", batch_size=1, dtype="bf16", target="h100")
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert [b.path for b in profile.blocks] == [f"layers.{i}" for i in range(32)]
    # The rotary tables go to every layer unchanged, so consecutive layers may share a region.
    assert all(b.joins_previous for b in profile.blocks[1:])
    assert profile.fingerprint["parameters"] == 6_738_415_616  # Llama-2-7B's published count
    assert profile.parameter_bytes == 2 * profile.fingerprint["parameters"]
    assert grown_kib < 1_000_000
