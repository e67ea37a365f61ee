"""The fast subset of the model zoo: library models with their libraries' defaults.

One model per family kind: a decoder with its default key/value cache, an encoder-decoder, two
towers, a staged vision model, a mixture of experts and DeBERTa (data-dependent ops), a LoRA
model (frozen base). ``benchmarks/zoo.py`` runs every zoo model through solve, verify and a
training loop; these tests keep the front end honest on each kind.
"""

from __future__ import annotations

import pytest

import ckptplan
from ckptplan.errors import BelowLeastPeak
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)

pytest.importorskip("transformers")
ZOO = ROOT / "sample_models" / "zoo"


def _units(name: str) -> list[str]:
    return [b.path for b in ckptplan.profile(ZOO / f"{name}.py").blocks]


def test_every_stage_of_an_encoder_decoder_is_planned_in_execution_order() -> None:
    units = _units("hf_t5")
    assert [u.rsplit(".", 1)[0] for u in units] == ["encoder.block"] * 4 + ["decoder.block"] * 4


def test_two_towers_are_planned_in_the_order_they_run() -> None:
    units = _units("hf_clip")
    towers = [u.split(".")[0] for u in units]
    assert towers == ["vision_model"] * 2 + ["text_model"] * 2


def test_stages_are_planned_block_by_block() -> None:
    units = _units("hf_swin")
    assert len(units) == 2 + 2 + 6 + 2
    assert all(".blocks." in u for u in units)


def test_a_plan_never_joins_blocks_of_different_stages() -> None:
    profile = ckptplan.profile(ZOO / "hf_swin.py")
    for previous, block in zip(profile.blocks, profile.blocks[1:], strict=False):
        if previous.path.rsplit(".", 1)[0] != block.path.rsplit(".", 1)[0]:
            assert not block.joins_previous
            assert previous.gap is not None, "the patch merging between stages is a gap"


def test_a_staged_model_reaches_the_memory_of_checkpointing_every_block() -> None:
    """The least feasible peak is the one-block-at-a-time recomputation of every stage, far
    below the unchecked peak (one ModuleList as the whole model reached 96% on ResNet-50)."""
    with pytest.raises(BelowLeastPeak) as refused:
        ckptplan.solve(ZOO / "hf_swin.py", budget="1", scope="activations", solver="dp")
    unchecked = ckptplan.solve(
        ZOO / "hf_swin.py", budget="100%", solver="none", scope="activations", fake_run=False
    )
    assert refused.value.least_bytes < 0.4 * unchecked.predicted.peak_bytes


@pytest.mark.parametrize("scope", ["step", "activations"])
def test_a_decoder_with_its_default_cache_is_planned_and_fits(scope: str) -> None:
    plan = ckptplan.solve(ZOO / "hf_gpt2.py", budget="60%", scope=scope)
    assert any("use_cache" in note for note in plan.settings.notes)
    check = ckptplan.verify(ZOO / "hf_gpt2.py", plan, repeats=1)
    assert check.measured_peak_bytes <= plan.budget.bytes
    assert check.max_grad_abs_diff <= 1e-6
    assert abs(check.measured_peak_bytes - check.predicted_peak_bytes) <= (
        0.05 * check.measured_peak_bytes
    )
    if scope == "step":  # the fake run takes the real step's path (no mask of its own)
        assert plan.predicted.fake_run_peak_bytes == check.tracked_peak_bytes


def test_an_encoder_decoder_plan_fits_its_activation_budget() -> None:
    plan = ckptplan.solve(ZOO / "hf_t5.py", budget="30%", scope="activations", solver="dp")
    assert {r.modules[0].split(".")[0] for r in plan.regions} == {"encoder", "decoder"}
    check = ckptplan.verify(ZOO / "hf_t5.py", plan, repeats=1)
    assert check.measured_peak_bytes <= plan.budget.bytes
    assert check.max_grad_abs_diff <= 1e-6


@pytest.mark.parametrize("name", ["hf_mixtral", "hf_deberta_v2"])
def test_data_dependent_ops_are_profiled_with_a_real_step(name: str) -> None:
    profile = ckptplan.profile(ZOO / f"{name}.py")
    assert len(profile.blocks) == 4
    assert any("real step" in note for note in profile.notes)


def test_lora_counts_gradients_and_optimizer_state_of_the_adapters_only() -> None:
    profile = ckptplan.profile(ZOO / "peft_lora_llama.py")
    assert len(profile.blocks) == 4
    assert profile.gradient_bytes < 0.05 * profile.parameter_bytes
    moments = 2 * profile.gradient_bytes  # AdamW's two moments, plus a step count per tensor
    assert moments <= profile.optimizer_bytes <= moments + 1024
    plan = ckptplan.solve(ZOO / "peft_lora_llama.py", budget="70%", scope="activations")
    check = ckptplan.verify(ZOO / "peft_lora_llama.py", plan, repeats=1)
    assert check.measured_peak_bytes <= plan.budget.bytes
    assert check.max_grad_abs_diff <= 1e-6


def test_the_least_feasible_peak_is_a_budget_that_solve_accepts() -> None:
    """The chain model keeps a saved tensor to the end of its backward node, a checkpoint's
    recomputed copy dies at its last use: BERT's plan of least peak runs 1 KiB under its
    prediction, and the least peak is what it runs at, a budget solve accepts and keeps."""
    model = ZOO / "hf_bert.py"
    with pytest.raises(BelowLeastPeak) as refused:
        ckptplan.solve(model, budget="1", scope="activations", solver="dp")
    least = refused.value.least_bytes
    plan = ckptplan.solve(model, budget=str(least), scope="activations", solver="dp", margin=0)
    assert plan.predicted.fake_run_peak_bytes <= least
    assert ckptplan.verify(model, plan, repeats=1).measured_peak_bytes <= least


def test_a_state_space_model_is_predicted_at_its_measured_peak() -> None:
    """Mamba's slow path reads its decay and a slice of its discretised state at every token:
    the engine sums those gradients in place, which the profiler's modes made out of place
    (predicted 11% over the allocator, and a budget its least plan meets refused)."""
    plan = ckptplan.solve(ZOO / "hf_mamba.py", budget="60%")
    assert plan.regions
    check = ckptplan.verify(ZOO / "hf_mamba.py", plan, repeats=1)
    assert check.measured_peak_bytes <= plan.budget.bytes
    assert abs(check.predicted_peak_bytes - check.measured_peak_bytes) <= (
        0.03 * check.measured_peak_bytes
    )
