"""Per-rank budgets, and the FSDP2 and DDP examples under ``torchrun --nproc_per_node 2``.

The launched tests train tests/models/tiny_gpt.py with dropout on: each rank draws its batch
and its dropout masks from seeds of (step, rank), so one unchecked process that accumulates
the two ranks' batches (each loss divided by the world size) computes the same losses and
gradients as the two checkpointed, sharded or replicated ranks. The plans are solved per rank
with ``per_rank`` in place of the profile (``ckptplan.solve`` takes no world size yet).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

import ckptplan
from ckptplan.errors import CkptplanError
from ckptplan.planning.distributed import per_rank
from ckptplan.planning.problem import selective_menus, to_chain
from ckptplan.planning.schedule_plan import plan_from_schedule
from ckptplan.profiling.training import make_optimizer
from ckptplan.solvers import run_solver
from ckptplan.values.budget import ResolvedBudget, parse_budget
from ckptplan.values.plan import Plan
from tests.conftest import MODELS, ROOT

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)

WORLD = 2
STEPS = 3
BATCH = 2


@pytest.fixture(scope="module")
def profile() -> ckptplan.profiling.profiler.Profile:
    return ckptplan.profile(MODELS / "tiny_gpt.py", batch_size=BATCH)


def common() -> ModuleType:
    """examples/common.py, the seeds and batches the examples use."""
    name = "ckptplan_examples_common"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / "common.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def per_rank_plan(mode: str, budget: str, solver: str) -> Plan:
    """A rank's plan of ``solver``, from a per-rank profile whose selective policies cost no
    dispatch time, so that auto keeps op outputs even on this small model."""
    profile = dataclasses.replace(
        per_rank(ckptplan.profile(MODELS / "tiny_gpt.py", batch_size=BATCH), WORLD, mode),
        policy_op_time=0.0,
    )
    menus = selective_menus(profile) if solver == "auto" else None
    chain = to_chain(profile, menus=menus)
    budget_bytes = parse_budget(budget).resolve(run_solver("none", chain, None).peak)
    schedule = run_solver(solver, chain, budget_bytes)
    plan = plan_from_schedule(profile, chain, schedule, ResolvedBudget(budget, budget_bytes), menus)
    return dataclasses.replace(
        plan, settings=dataclasses.replace(plan.settings, world_size=WORLD, parallel=mode)
    )


def test_fsdp_shards_the_persistent_bytes_and_adds_a_working_set(profile) -> None:
    rank = per_rank(profile, WORLD, "fsdp")
    sharded = profile.parameter_bytes + profile.optimizer_bytes
    assert rank.parameter_bytes == -(-profile.parameter_bytes // WORLD)
    assert rank.persistent_bytes < profile.persistent_bytes - sharded // 2 + 1024
    assert rank.persistent_bytes > profile.persistent_bytes - sharded
    biggest = max(b.parameter_bytes for b in profile.blocks)
    for before, after in zip(profile.blocks, rank.blocks, strict=True):
        assert after.fwd_peak - after.fwd_start == before.fwd_peak - before.fwd_start + 2 * biggest
        assert after.grads_at_bwd_end <= before.grads_at_bwd_end
    assert rank.peak_bytes < profile.peak_bytes
    assert [e for _, e in rank.fixed_peaks] == [e for _, e in profile.fixed_peaks]


def test_ddp_adds_the_gradient_buckets_everywhere(profile) -> None:
    rank = per_rank(profile, WORLD, "ddp")
    buckets = profile.parameter_bytes
    assert rank.persistent_bytes == profile.persistent_bytes + buckets
    assert rank.peak_bytes == profile.peak_bytes + buckets
    unchecked = run_solver("none", to_chain(profile), None)
    assert run_solver("none", to_chain(rank), None).peak == unchecked.peak + buckets


def test_more_ranks_need_less_memory_under_fsdp(profile) -> None:
    peaks = [per_rank(profile, n, "fsdp").peak_bytes for n in (1, 2, 4, 8)]
    assert peaks == sorted(peaks, reverse=True)


def test_bad_arguments_are_one_line_errors(profile) -> None:
    with pytest.raises(CkptplanError, match="unknown parallel mode 'tp'"):
        per_rank(profile, WORLD, "tp")
    with pytest.raises(CkptplanError, match="at least 1"):
        per_rank(profile, 0, "ddp")
    with pytest.raises(CkptplanError, match="no blocks"):
        per_rank(dataclasses.replace(profile, blocks=()), WORLD, "ddp")


def launch(script: str, plan: Plan, tmp_path: Path) -> list[dict]:
    """Run an example on two CPU processes; each rank's report."""
    plan.save(tmp_path / "plan.json")
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
        *("--nproc_per_node", str(WORLD), str(ROOT / "examples" / script)),
        *(str(tmp_path / "plan.json"), "--model", str(MODELS / "tiny_gpt.py")),
        *("--steps", str(STEPS), "--report", str(tmp_path / "report")),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reports = []
    for rank in range(WORLD):
        report = torch.load(tmp_path / "report" / f"rank{rank}.pt")
        report["grads"] = torch.load(tmp_path / "report" / f"grads{rank}.pt")
        reports.append(report)
    return reports


def single_process(plan: Plan) -> tuple[list[list[float]], dict[str, torch.Tensor]]:
    """Losses per rank and step, and the first step's gradients, of one unchecked process."""
    examples = common()
    workload = examples.load(MODELS / "tiny_gpt.py")
    torch.manual_seed(0)
    model = workload.build().train()
    optimizer = make_optimizer(plan.settings.optimizer, model)
    losses: list[list[float]] = [[] for _ in range(WORLD)]
    grads: dict[str, torch.Tensor] = {}
    for step in range(STEPS):
        for rank in range(WORLD):
            inputs = examples.batch(workload, plan, rank, step, torch.device("cpu"))
            loss = examples.loss_of(workload, model, inputs)
            losses[rank].append(loss.item())
            (loss / WORLD).backward()
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
        model.zero_grad(set_to_none=True)
    return losses, grads


def check_against_single_process(plan: Plan, reports: list[dict]) -> None:
    losses, grads = single_process(plan)
    for rank, report in enumerate(reports):
        assert report["losses"] == pytest.approx(losses[rank], abs=1e-6, rel=0)
        assert report["grads"].keys() == grads.keys()
        for name, grad in grads.items():
            assert torch.allclose(report["grads"][name], grad, atol=1e-6, rtol=0), name
        assert report["peak"] <= report["budget"]
        regions = len(plan.regions)
        assert report["recomputed"] == regions * STEPS
        assert f"recomputed {regions} of {regions}" in report["first_backward"]


def test_fsdp2_example_matches_one_process_within_the_per_rank_budget(tmp_path) -> None:
    plan = per_rank_plan("fsdp", "1.0", "sqrt")
    assert any(len(r.modules) > 1 for r in plan.regions), "a multi-block region under FSDP2"
    check_against_single_process(plan, launch("train_fsdp.py", plan, tmp_path))


def test_ddp_example_matches_one_process_within_the_per_rank_budget(tmp_path) -> None:
    plan = per_rank_plan("ddp", "0.8", "auto")
    assert any(r.policy for r in plan.regions), "selective policies under DDP"
    check_against_single_process(plan, launch("train_ddp.py", plan, tmp_path))


def test_an_example_refuses_a_plan_for_another_layout(tmp_path) -> None:
    plan = per_rank_plan("ddp", "1.0", "none")
    plan.save(tmp_path / "plan.json")
    examples = common()
    with pytest.raises(CkptplanError, match="re-solve it with --world-size 2 --fsdp"):
        examples.check_layout(plan, WORLD, "fsdp")


def test_solve_makes_a_per_rank_plan(profile) -> None:
    plan = ckptplan.solve(
        MODELS / "tiny_gpt.py", budget="1.0", batch_size=BATCH, world_size=WORLD, strategy="fsdp"
    )
    assert (plan.settings.world_size, plan.settings.parallel) == (WORLD, "fsdp")
    assert plan.budget.bytes == per_rank(profile, WORLD, "fsdp").peak_bytes
    with pytest.raises(CkptplanError, match="needs strategy='fsdp' or strategy='ddp'"):
        ckptplan.solve(MODELS / "tiny_gpt.py", budget="1.0", batch_size=BATCH, world_size=WORLD)
    with pytest.raises(CkptplanError, match="verify it where it runs"):
        ckptplan.verify(MODELS / "tiny_gpt.py", plan)
