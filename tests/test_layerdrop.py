"""Models that skip blocks at random (LayerDrop, random depth) keep exact gradients.

A region of several blocks runs them back to back from the first one's call, so the solver may
join only blocks that nothing runs between (Note [joining blocks]): a LayerDrop draw between
two layers keeps them apart. The profile prices the step in which every block runs
(``ckptplan.profiling.everyblock``). Gradients are compared with the unchecked model's at every
step of a training loop, with the same seeds, on a model whose draws skip layers.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import ckptplan
from ckptplan.callerstate import seed_all
from ckptplan.errors import BelowLeastPeak, CkptplanError
from ckptplan.loading import call_model, load_model_file
from ckptplan.profiling.everyblock import EveryBlockRuns
from tests.conftest import MODELS, ROOT

WAV2VEC2 = ROOT / "sample_models" / "zoo" / "hf_wav2vec2.py"

MLP = MODELS / "layerdrop_mlp.py"


def _profile(monkeypatch: pytest.MonkeyPatch, draw: str) -> ckptplan.Profile:
    monkeypatch.setenv("LAYERDROP_DRAW", draw)
    return ckptplan.profile(MLP)


def test_blocks_with_a_draw_between_them_are_all_profiled_and_never_joined(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    profile = _profile(monkeypatch, "torch")
    assert [b.path for b in profile.blocks] == [f"layers.{i}" for i in range(12)]
    assert not any(b.joins_previous for b in profile.blocks)
    assert EveryBlockRuns.NOTE in profile.notes


def test_blocks_with_nothing_between_them_still_join(monkeypatch: pytest.MonkeyPatch) -> None:
    profile = _profile(monkeypatch, "none")
    assert [b.joins_previous for b in profile.blocks] == [False] + [True] * 11
    assert EveryBlockRuns.NOTE not in profile.notes


def test_skipping_with_pythons_generator_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LAYERDROP_DRAW", "python")
    monkeypatch.setenv("LAYERDROP", "0.5")
    with pytest.raises(CkptplanError, match="skips blocks at random with Python's"):
        ckptplan.profile(MLP)


def _gradients_each_step(
    model_file: Path, plan: ckptplan.Plan, steps: int, layers: str = "layers", count: int = 12
) -> tuple[float, int]:
    """The largest gradient difference over ``steps`` seeded SGD steps of the planned model
    against the unchecked one, and how many of the ``count`` layers ``layers.i`` the draws
    skipped in all."""
    model = load_model_file(model_file)
    seed_all(0)
    base = model.build().train()
    planned = ckptplan.apply(copy.deepcopy(base), plan)
    inputs = model.inputs(plan.settings.batch_size)
    optimizers = [torch.optim.SGD(m.parameters(), lr=1e-3) for m in (base, planned)]
    worst, skipped = 0.0, 0
    for step in range(steps):
        grads = []
        for m, optimizer in zip((base, planned), optimizers, strict=True):
            seed_all(step)
            model.loss(call_model(m, inputs)).backward()
            grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        assert grads[0].keys() == grads[1].keys()
        ran = [any(n.startswith(f"{layers}.{i}.") for n in grads[0]) for i in range(count)]
        skipped += ran.count(False)
        worst = max(worst, *((grads[0][n] - grads[1][n]).abs().max().item() for n in grads[0]))
    return worst, skipped


def test_layerdrop_gradients_equal_the_unchecked_models_at_every_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LAYERDROP_DRAW", "torch")
    with pytest.raises(BelowLeastPeak) as refused:
        ckptplan.solve(MLP, budget="1", scope="activations", solver="dp")
    least = str(refused.value.least_bytes)
    plan = ckptplan.solve(MLP, budget=least, scope="activations", margin=0, solver="dp")
    # Without the draws, the least peak joins layers (see the test above and below).
    assert len(plan.regions) >= 10 and all(len(r.modules) == 1 for r in plan.regions)
    worst, skipped = _gradients_each_step(MLP, plan, steps=30)
    assert skipped > 0, "the draws skip layers in some steps"
    assert worst == 0.0


def test_without_draws_the_least_peak_joins_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the same blocks with nothing between them are joined at the least peak,
    so the test above checks a plan that would join if the draws were not seen."""
    monkeypatch.setenv("LAYERDROP_DRAW", "none")
    with pytest.raises(BelowLeastPeak) as refused:
        ckptplan.solve(MLP, budget="1", scope="activations", solver="dp")
    least = str(refused.value.least_bytes)
    plan = ckptplan.solve(MLP, budget=least, scope="activations", margin=0, solver="dp")
    assert any(len(r.modules) > 1 for r in plan.regions)


@pytest.mark.slow
@pytest.mark.parametrize("layerdrop", ["0.1", "0.3"])
def test_wav2vec2_with_layerdrop_trains_with_exact_gradients(
    monkeypatch: pytest.MonkeyPatch, layerdrop: str
) -> None:
    """Hugging Face's Wav2Vec2ForCTC with its library's defaults (LayerDrop, SpecAugment drawn
    with NumPy), its encoder layers as blocks, at the least feasible peak: 30 steps, every
    step's gradients equal to the unchecked model's."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("LAYERDROP", layerdrop)
    blocks = "wav2vec2.encoder.layers.*"
    with pytest.raises(BelowLeastPeak) as refused:
        ckptplan.solve(WAV2VEC2, budget="1", scope="activations", blocks=blocks)
    least = str(refused.value.least_bytes)
    plan = ckptplan.solve(WAV2VEC2, budget=least, scope="activations", blocks=blocks, margin=0)
    assert EveryBlockRuns.NOTE in plan.settings.notes
    layers = "wav2vec2.encoder.layers"
    worst, skipped = _gradients_each_step(WAV2VEC2, plan, 30, layers, count=6)
    assert skipped > 0
    assert worst == 0.0
