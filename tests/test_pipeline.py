"""Pipeline-parallel stages: in-flight counts, the stage split, per-stage plans, ``apply``
of one stage, and examples/train_pipeline.py under ``torchrun --nproc_per_node 2``.

The launched test trains tests/models/pipe_gpt.py (dropout on) as two 1F1B stages and checks
each rank's allocator-measured peak against its stage budget, and its gradients against one
unchecked process that runs the two stages one after another over the same microbatches, each
stage's forward seeded by (step, stage, microbatch) as the example seeds it.
"""

from __future__ import annotations

import doctest
import importlib.util
import os
import subprocess
import sys
from types import ModuleType

import pytest
import torch

import ckptplan
import ckptplan.values.pipeline_types
from ckptplan.errors import CkptplanError
from ckptplan.profiling.training import make_optimizer
from ckptplan.values.pipeline_types import Pipeline, balanced_split, in_flight
from ckptplan.values.plan import Plan
from tests.conftest import MODELS, ROOT
from tests.test_distributed import common

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)

MODEL = MODELS / "pipe_gpt.py"
BATCH, MICROBATCHES, STEPS = 8, 4, 3


def solve(schedule: str, budget: str = "0.8", **extra) -> Plan:
    pipeline = Pipeline(stages=2, microbatches=MICROBATCHES, schedule=schedule, **extra)
    return ckptplan.solve_pipeline(
        MODEL, budget=budget, batch_size=BATCH, blocks="layers.*", pipeline=pipeline
    )


@pytest.fixture(scope="module")
def one_f_one_b() -> Plan:
    return solve("1f1b")


def model_file() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pipe_gpt", MODEL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_doctests_of_the_counts_and_the_split() -> None:
    assert doctest.testmod(ckptplan.values.pipeline_types).failed == 0


def test_in_flight_counts() -> None:
    for m in (4, 8):
        one = Pipeline(stages=4, microbatches=m, schedule="1f1b")
        assert [in_flight(one, i) for i in range(4)] == [min(m, 4 - i) for i in range(4)]
        gpipe = Pipeline(stages=4, microbatches=m, schedule="gpipe")
        assert {in_flight(gpipe, i) for i in range(4)} == {m}
    # Interleaved: never more than the microbatches, and more on the earlier virtual stages.
    inter = Pipeline(stages=4, microbatches=8, schedule="interleaved-1f1b", stages_per_rank=2)
    counts = [in_flight(inter, i) for i in range(8)]
    assert max(counts) <= 8 and counts[0] > counts[-1] >= 1
    assert counts[:4] == sorted(counts[:4], reverse=True)


def test_balanced_split_by_time_then_blocks() -> None:
    assert balanced_split([1.0] * 6, 2) == (3, 3)
    assert balanced_split([1.0] * 6, 4) == (1, 1, 2, 2)
    assert balanced_split([3.0, 1.0, 1.0, 1.0], 2) == (1, 3)
    assert sum(balanced_split([0.5, 2.0, 0.1, 0.1, 3.0, 0.2], 3)) == 6


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        (Pipeline(stages=1, microbatches=4, schedule="1f1b"), "at least 2 stages"),
        (Pipeline(stages=4, microbatches=2, schedule="1f1b"), "microbatches=4 or more"),
        (Pipeline(stages=8, microbatches=8, schedule="gpipe"), "chain of 6 blocks"),
        (Pipeline(stages=2, microbatches=4, schedule="zb"), "is no pipeline schedule"),  # type: ignore[arg-type]
        (Pipeline(stages=2, microbatches=4, schedule="1f1b", split=(2, 2)), "stage_split='3,3'"),
        (Pipeline(stages=2, microbatches=4, schedule="gpipe", stages_per_rank=2), "is for"),
    ],
)
def test_bad_pipelines_are_one_line_errors(pipeline: Pipeline, message: str) -> None:
    with pytest.raises(CkptplanError, match=message) as caught:
        pipeline.check(6)
    assert "\n" not in str(caught.value)


def test_a_batch_that_does_not_split_into_microbatches_is_refused() -> None:
    with pytest.raises(CkptplanError, match="does not split into 4 microbatches"):
        ckptplan.solve_pipeline(
            MODEL,
            budget="0.8",
            batch_size=6,
            pipeline=Pipeline(stages=2, microbatches=4, schedule="1f1b"),
        )


def test_cli_refuses_bad_pipeline_flags_in_one_line() -> None:
    command = [sys.executable, "-m", "ckptplan", "solve", str(MODEL), "--budget", "80%"]
    command += ["--batch-size", "8", "--pipeline-stages", "2", "--microbatches", "1"]
    done = subprocess.run(
        [*command, "--schedule", "1f1b"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --microbatches 1 with 2 stages: 1f1b needs at least one microbatch per stage; "
        "use --microbatches 2 or more"
    ]


def checkpointed(plan: Plan, stage: int) -> int:
    return sum(len(r.modules) for r in plan.stages[stage].regions)


def test_plans_follow_the_schedule(one_f_one_b: Plan) -> None:
    plan = one_f_one_b
    assert [s.in_flight for s in plan.stages] == [2, 1]
    assert [s.blocks for s in plan.stages] == [
        ("layers.0", "layers.1", "layers.2"),
        ("layers.3", "layers.4", "layers.5"),
    ]
    # The first stage keeps two microbatches, the last one: at one budget the first needs more.
    assert checkpointed(plan, 0) > checkpointed(plan, 1)
    for stage in plan.stages:
        assert stage.predicted_peak_bytes <= stage.budget_bytes == plan.budget.bytes
    gpipe = solve("gpipe", budget=str(plan.budget.bytes))
    assert [s.in_flight for s in gpipe.stages] == [4, 4]
    assert checkpointed(gpipe, 1) > checkpointed(plan, 1)


def test_an_impossible_stage_budget_names_the_stage_and_the_least_budget() -> None:
    with pytest.raises(CkptplanError, match=r"of stage 0 \(rank 0.*use budget='[0-9.]+MiB'"):
        solve("gpipe", budget="0.3")


def test_plan_round_trips_and_old_plans_load(one_f_one_b: Plan, tmp_path) -> None:
    one_f_one_b.save(tmp_path / "plan.json")
    assert Plan.load(tmp_path / "plan.json") == one_f_one_b
    old = {k: v for k, v in one_f_one_b.to_json().items() if k != "stages"}
    assert Plan.from_json(old).stages == ()
    assert "stages" not in Plan.from_json(old).to_json()


def test_apply_one_stage_and_its_refusals(one_f_one_b: Plan) -> None:
    source = model_file()
    first = source.stage_module(
        source.build_model(), ["layers.0", "layers.1", "layers.2"], True, False
    )
    with pytest.raises(CkptplanError, match="out of range"):
        ckptplan.apply(first, one_f_one_b, stage=2)
    with pytest.raises(CkptplanError, match=r"lacks layers\.3"):
        ckptplan.apply(first, one_f_one_b, stage=1)
    without = Plan.from_json({k: v for k, v in one_f_one_b.to_json().items() if k != "stages"})
    with pytest.raises(CkptplanError, match="has no pipeline stages"):
        ckptplan.apply(first, without, stage=0)
    applied = ckptplan.apply(first, one_f_one_b, stage=0)
    assert [r for r in applied.ckptplan_applied.regions] == [
        r.modules for r in one_f_one_b.stages[0].regions
    ]


def test_apply_refuses_a_stage_of_another_model(one_f_one_b: Plan) -> None:
    source = model_file()
    model = source.build_model()
    del model.layers["1"].mlp[2]
    stage = source.stage_module(model, ["layers.0", "layers.1", "layers.2"], True, False)
    with pytest.raises(CkptplanError, match="blocks here differ"):
        ckptplan.apply(stage, one_f_one_b, stage=0)


def single_process(plan: Plan) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses and first-step gradients of one unchecked process running both stages."""
    source, examples = model_file(), common()
    last = len(plan.stages) - 1
    stages = []
    for section in plan.stages:
        torch.manual_seed(0)
        model = source.build_model().train()
        stages.append(
            source.stage_module(
                model, list(section.blocks), section.index == 0, section.index == last
            )
        )
    optimizers = [make_optimizer("adamw", s) for s in stages]
    shapes = [torch.empty(1, 32), torch.empty(1, 32, 64)]
    losses, grads = [], {}
    for step in range(STEPS):
        tokens, targets = examples.pipeline_batch(shapes, BATCH, step, torch.device("cpu"))
        total = 0.0
        for m, (x, y) in enumerate(
            zip(tokens.tensor_split(MICROBATCHES), targets.tensor_split(MICROBATCHES), strict=True)
        ):
            for index, stage in enumerate(stages):
                torch.manual_seed(examples.microbatch_seed(step, index, m))
                x = stage(x)
            loss = source.pipeline_loss(x, y)
            (loss / MICROBATCHES).backward()
            total += loss.item() / MICROBATCHES
        losses.append(total)
        if step == 0:
            grads = [{n: p.grad.clone() for n, p in s.named_parameters()} for s in stages]
        for optimizer, stage in zip(optimizers, stages, strict=True):
            optimizer.step()
            stage.zero_grad(set_to_none=True)
    return losses, grads


def test_the_pipeline_example_fits_each_stage_and_matches_one_process(
    one_f_one_b, tmp_path
) -> None:
    plan = one_f_one_b
    plan.save(tmp_path / "plan.json")
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"),
        *(str(ROOT / "examples" / "train_pipeline.py"), str(tmp_path / "plan.json")),
        *("--model", str(MODEL), "--steps", str(STEPS), "--report", str(tmp_path / "report")),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    losses, grads = single_process(plan)
    for rank, section in enumerate(plan.stages):
        report = torch.load(tmp_path / "report" / f"rank{rank}.pt")
        assert report["peak"] <= section.budget_bytes, (rank, report["peak"], section)
        assert report["predicted"] == section.predicted_peak_bytes
        regions = len(section.regions)
        assert report["recomputed"] == regions * MICROBATCHES * STEPS
        measured = torch.load(tmp_path / "report" / f"grads{rank}.pt")
        assert measured.keys() == grads[rank].keys()
        for name, grad in grads[rank].items():
            assert torch.allclose(measured[name], grad, atol=1e-6, rtol=0), (rank, name)
    last = torch.load(tmp_path / "report" / "rank1.pt")
    assert last["losses"] == pytest.approx(losses, abs=1e-6, rel=0)


def test_interleaved_stages_share_their_rank_budget() -> None:
    plan = solve("interleaved-1f1b", stages_per_rank=2)
    assert [s.rank for s in plan.stages] == [0, 1, 0, 1]
    assert [s.in_flight for s in plan.stages] == [4, 3, 2, 1]
    assert sum(len(s.blocks) for s in plan.stages) == 6
    for rank in (0, 1):
        peaks = {s.predicted_peak_bytes for s in plan.stages if s.rank == rank}
        assert len(peaks) == 1 and peaks.pop() <= plan.budget.bytes


def test_data_parallel_stages_hold_their_share_of_the_sharded_state(one_f_one_b: Plan) -> None:
    pipeline = Pipeline(stages=2, microbatches=MICROBATCHES, schedule="1f1b")
    sharded = ckptplan.solve_pipeline(
        MODEL,
        budget=str(one_f_one_b.budget.bytes),
        batch_size=BATCH,
        blocks="layers.*",
        pipeline=pipeline,
        world_size=2,
        strategy="fsdp",
    )
    assert (sharded.settings.world_size, sharded.settings.parallel) == (2, "fsdp")
    for alone, shard in zip(one_f_one_b.stages, sharded.stages, strict=True):
        assert shard.predicted.fixed_bytes < alone.predicted.fixed_bytes


def test_stage_without_a_plan_is_refused() -> None:
    source = model_file()
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'plan'"):
        ckptplan.apply(source.build_model(), stage=0)
