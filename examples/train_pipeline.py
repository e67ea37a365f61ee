"""Train a pipeline with a ckptplan plan per stage: ``torchrun --nproc_per_node 2
examples/train_pipeline.py plan.json --model tests/models/pipe_gpt.py``, gloo on CPU.

Make the plan for the pipeline (``--batch-size`` is the whole step's batch; each microbatch
is a quarter of it here):

    ckptplan solve tests/models/pipe_gpt.py --blocks 'layers.*' --budget 80% --batch-size 8 \\
        --pipeline-stages 2 --microbatches 4 --schedule 1f1b -o plan.json

Each rank builds the whole model, cuts it to its stage as torchtitan does (the model file's
``stage_module``: the other layers deleted, their names kept), applies its stage's section
(``ckptplan.apply(stage, plan, stage=rank)``), then runs ``torch.distributed.pipelining``'s
schedule with the model file's ``pipeline_loss`` on the last stage. Each stage seeds its
dropout per (step, stage, microbatch) before every microbatch's forward, so one process that
runs the stages one after another draws the same masks (``tests/test_pipeline.py``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import torch
import torch.distributed as dist
from common import (
    Memory,
    Report,
    arguments,
    load,
    microbatch_seed,
    pipeline_batch,
    start_ranks,
)
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

import ckptplan
from ckptplan.applying.pipeline_stage import stage_plan
from ckptplan.errors import CkptplanError
from ckptplan.profiling.training import make_optimizer

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def model_file(path: Path) -> ModuleType:
    """The model file as a module: its ``stage_module`` and ``pipeline_loss``."""
    spec = importlib.util.spec_from_file_location("pipeline_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class MicrobatchSeeds:
    """A forward pre-hook that seeds each microbatch's forward by (step, stage, microbatch):
    the stage module's forward runs once per microbatch, in order (checkpoints recompute its
    blocks, not it)."""

    def __init__(self, stage: int) -> None:
        self.stage = stage
        self.step = 0
        self.microbatch = 0

    def start(self, step: int) -> None:
        self.step, self.microbatch = step, 0

    def __call__(self, module: torch.nn.Module, args: object) -> None:
        torch.manual_seed(microbatch_seed(self.step, self.stage, self.microbatch))
        self.microbatch += 1


def boundaries(source: ModuleType, plan: ckptplan.Plan, microbatch: int) -> list[torch.Tensor]:
    """Meta tensors of every stage's input, then the last stage's output: PipelineStage's
    static metadata, so it runs no forward of its own to infer shapes."""
    with torch.device("meta"):
        x = source.example_inputs(microbatch)[0]
        shapes = [x]
        last = len(plan.stages) - 1
        for section in plan.stages:
            module = source.stage_module(
                source.build_model(),
                list(section.blocks),
                section.index == 0,
                section.index == last,
            )
            x = module(x)
            shapes.append(x)
    return shapes


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    rank, world, device = start_ranks()
    plan = ckptplan.Plan.load(args.plan)
    pipe = plan.settings.pipeline
    if not pipe or pipe["stages"] != world or pipe["schedule"] not in SCHEDULES:
        raise CkptplanError(
            f"the plan is not for a {world}-stage GPipe or 1F1B pipeline; re-solve it with "
            f"--pipeline-stages {world} --microbatches M --schedule 1f1b"
        )
    microbatches, last = pipe["microbatches"], world - 1
    workload, source = load(args.model), model_file(args.model)
    shapes = boundaries(source, plan, pipe["microbatch_size"])
    report = Report(rank, args.report)
    seeds = MicrobatchSeeds(rank)
    with Memory(device) as memory:
        torch.manual_seed(0)  # the same weights on every rank
        model = workload.build().to(device).train()
        module = source.stage_module(model, list(plan.stages[rank].blocks), rank == 0, rank == last)
        module = ckptplan.apply(module, plan, stage=rank)
        module.register_forward_pre_hook(seeds)
        stage = PipelineStage(
            module, rank, world, device, input_args=shapes[rank], output_args=shapes[rank + 1]
        )
        schedule = SCHEDULES[pipe["schedule"]](
            stage, n_microbatches=microbatches, loss_fn=source.pipeline_loss
        )
        optimizer = make_optimizer(plan.settings.optimizer, module)
        for step in range(args.steps):
            memory.step(step)
            seeds.start(step)
            tokens, targets = pipeline_batch(shapes, plan.settings.batch_size, step, device)
            losses: list[torch.Tensor] = []
            if rank == 0:
                schedule.step(tokens, return_outputs=False)
            elif rank == last:
                schedule.step(target=targets, losses=losses, return_outputs=False)
            else:
                schedule.step(return_outputs=False)
            loss = torch.stack(losses).mean() if losses else torch.tensor(float("nan"))
            report.after_backward(step, loss.detach(), module)
            del losses, loss
            if optimizer is not None:
                optimizer.step()
            module.zero_grad(set_to_none=True)
        peak = memory.peak()
    report.write(module, stage_plan(module, plan, rank), peak)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
