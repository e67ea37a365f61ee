"""The fake step runs the real step's ops: same aten ops, same output shapes and dtypes.

Every prediction comes from the fake step, so a branch a library takes only on fake tensors
(transformers' packed-sequence mask) or a fake kernel that lays out its output otherwise than
the CPU kernel (layer norm's backward, then a reshape that copies) shows here first. The
zoo's fast subset and the bundled samples; ``benchmarks/zoo.py`` checks every zoo model.
"""

from __future__ import annotations

import pytest

import ckptplan
from ckptplan.loading import load_model_file
from ckptplan.profiling.opsequence import first_divergence, step_ops
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)

SAMPLES = ["mlp", "gpt", "resnet", "unet", "vit"]
ZOO_FAST = ["hf_gpt2", "hf_t5", "hf_clip", "hf_swin", "peft_lora_llama"]


@pytest.mark.parametrize(
    "path",
    [ROOT / "sample_models" / f"{s}.py" for s in SAMPLES]
    + [ROOT / "sample_models" / "zoo" / f"{z}.py" for z in ZOO_FAST],
    ids=SAMPLES + ZOO_FAST,
)
def test_the_fake_step_runs_the_real_steps_ops(path) -> None:
    if "zoo" in path.parts:
        pytest.importorskip("transformers")
        pytest.importorskip("peft")
    workload = load_model_file(path)
    fake, real = step_ops(workload, real=False), step_ops(workload, real=True)
    assert first_divergence(fake, real) is None
    assert len(fake) > 100


@pytest.mark.parametrize("name", ["hf_deberta_v2", "hf_mixtral"])
def test_a_step_fake_tensors_cannot_run_is_profiled_for_real(name: str) -> None:
    """Token routing and ``nonzero`` read values: there the profile is a real step, so the
    ops it records are the real step's by construction."""
    pytest.importorskip("transformers")
    profile = ckptplan.profile(ROOT / "sample_models" / "zoo" / f"{name}.py")
    assert any("real step" in note for note in profile.notes)
