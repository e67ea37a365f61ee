"""A plan for a GPU, made on a CPU: the profile sees the attention kernel the GPU runs."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import ckptplan
from ckptplan.applying.gpukernels import FLASH
from ckptplan.errors import CkptplanError
from ckptplan.loading import load_model_file
from ckptplan.profiling.training import cast_model
from ckptplan.values.plan import Plan, Region
from ckptplan.values.policy_types import OpCall, Policy
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)

GPT = ROOT / "sample_models" / "gpt.py"


def _attention_ops(profile: ckptplan.profiling.profiler.Profile) -> list:
    return [o for o in profile.ops if "attention" in o.op and not o.backward]


def _flash_saved_bytes(batch: int, heads: int, tokens: int, head: int) -> int:
    """What the flash kernel's fake implementation saves for backward, called on its own."""
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.untyped_storage().nbytes())
        return t

    with FakeTensorMode(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        q, k, v = (
            torch.randn(batch, heads, tokens, head, dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        FLASH(q, k, v, 0.1, True)
    # q, k and v come from one projection in the model, whose storage is counted there.
    return sum(saved) - 3 * q.untyped_storage().nbytes()


def test_a_gpu_plan_profiles_flash_attention_and_saves_what_it_saves() -> None:
    cpu = ckptplan.profile(GPT, dtype="bf16")
    gpu = ckptplan.profile(GPT, dtype="bf16", target="h100")
    assert {o.op for o in _attention_ops(cpu)} != {str(FLASH)}
    flash = _attention_ops(gpu)
    assert {o.op for o in flash} == {str(FLASH)}
    module = load_model_file(GPT).module
    batch, tokens = 4, module.BLOCK_SIZE
    heads, width = module.N_HEAD, module.N_EMBD
    expected = _flash_saved_bytes(batch, heads, tokens, width // heads)
    # Beyond q, k and v it saves what it makes (output, logsumexp, RNG seed and offset); the
    # profile's record of the op also holds what the next op saves before it runs.
    assert flash[0].allocated_bytes == expected <= flash[0].saved_bytes
    assert gpu.blocks[0].saved_bytes < cpu.blocks[0].saved_bytes, "no T x T weights on the GPU"


def test_a_plan_that_keeps_a_gpu_kernel_is_refused_where_it_never_runs() -> None:
    plan = ckptplan.solve(GPT, budget="100%", solver="none", target="h100", dtype="bf16")
    keeps_flash = Policy((OpCall(str(FLASH)),))
    plan = Plan.from_json(
        {**plan.to_json(), "regions": [Region(("blocks.0",), policy=keeps_flash).to_json()]}
    )
    workload = load_model_file(GPT)
    model = ckptplan.apply(cast_model(workload.build(), torch.bfloat16), plan)
    with pytest.raises(CkptplanError, match=r"made for a GPU.*solve again with target='cpu'"):
        workload.loss(model(*workload.inputs(2)))


def test_llama_7b_for_an_h100_keeps_attention_memory_linear_in_the_sequence() -> None:
    """4096 tokens, 32 heads: the CPU math path would keep 32 x 4096 x 4096 weights a layer
    (1 GiB in bf16); flash attention keeps its output and a logsumexp per row."""
    module = load_model_file(ROOT / "sample_models" / "llama7b.py").module
    profile = ckptplan.profile(module.__file__, target="h100", dtype="bf16")
    tokens, width = module.SEQ_LEN, module.N_EMBD
    flash = _attention_ops(profile)
    assert flash and {o.op for o in flash} == {str(FLASH)}
    per_row = width * 2 + module.N_HEAD * 4  # bf16 output, fp32 logsumexp per head
    assert {o.allocated_bytes for o in flash} == {tokens * per_row + 24}
    assert max(o.allocated_bytes for o in profile.ops) < module.N_HEAD * tokens * tokens * 2


def test_a_gpu_plan_recomputes_with_the_gpus_kernels_in_its_fake_run() -> None:
    """Recomputation runs inside backward, where torch-function modes are off: a region
    re-enters the GPU's kernels there, or the fake run recomputes CPU attention (another
    number of saved tensors, a CheckpointError)."""
    plan = ckptplan.solve(GPT, budget="80%", solver="dp", target="h100", dtype="bf16")
    assert plan.regions
    assert plan.predicted.fake_run_peak_bytes == plan.predicted.peak_bytes


def test_verify_refuses_to_judge_a_gpu_plan_on_the_cpu() -> None:
    plan = ckptplan.solve(GPT, budget="100%", solver="none", target="h100", fake_run=False)
    with pytest.raises(CkptplanError, match=r"made for h100.*run_on='cuda'.*force=True"):
        ckptplan.verify(GPT, plan, run_on="cpu", repeats=1)
