"""Train under FSDP2 with a ckptplan plan: ``torchrun --nproc_per_node 2 examples/train_fsdp.py
plan.json``, gloo on CPU, NCCL on GPUs.

Make the plan per rank (the budget is one rank's memory, --batch-size one rank's batch):

    ckptplan solve sample_models/gpt.py --budget 60% --world-size 2 --fsdp -o plan.json

The order matters: ``ckptplan.apply`` first, then ``fully_shard`` each block and the root
(the layout the per-rank budget assumes), then the optimizer.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from common import (
    Memory,
    Report,
    arguments,
    batch,
    check_layout,
    load,
    loss_of,
    start_ranks,
)
from torch.distributed.fsdp import fully_shard

import ckptplan
from ckptplan.profiling.training import make_optimizer


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    rank, world, device = start_ranks()
    plan = ckptplan.Plan.load(args.plan)
    check_layout(plan, world, "fsdp")
    workload = load(args.model)
    report = Report(rank, args.report)
    with Memory(device) as memory:
        torch.manual_seed(0)  # the same weights on every rank
        model = workload.build().to(device).train()
        model = ckptplan.apply(model, plan)
        for path in plan.blocks:
            fully_shard(model.get_submodule(path))
        fully_shard(model)
        optimizer = make_optimizer(plan.settings.optimizer, model)
        for step in range(args.steps):
            memory.step(step)
            inputs = batch(workload, plan, rank, step, device)
            loss = loss_of(workload, model, inputs)
            loss.backward()
            report.after_backward(step, loss, model)
            del loss
            if optimizer is not None:
                optimizer.step()
            model.zero_grad(set_to_none=True)
        peak = memory.peak()
    report.write(model, plan, peak)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
