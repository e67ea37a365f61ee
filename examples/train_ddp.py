"""Train under DDP with a ckptplan plan: ``torchrun --nproc_per_node 2 examples/train_ddp.py
plan.json``, gloo on CPU, NCCL on GPUs.

Make the plan per rank (the budget is one rank's memory, --batch-size one rank's batch):

    ckptplan solve sample_models/gpt.py --budget 60% --world-size 2 --ddp -o plan.json

The order matters: ``ckptplan.apply`` first, then ``DistributedDataParallel``, then the
optimizer. Non-reentrant checkpointing needs no ``static_graph`` or ``find_unused_parameters``.
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
from torch.nn.parallel import DistributedDataParallel

import ckptplan
from ckptplan.profiling.training import make_optimizer


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    rank, world, device = start_ranks()
    plan = ckptplan.Plan.load(args.plan)
    check_layout(plan, world, "ddp")
    workload = load(args.model)
    report = Report(rank, args.report)
    with Memory(device) as memory:
        torch.manual_seed(0)  # the same weights on every rank
        model = workload.build().to(device).train()
        model = ckptplan.apply(model, plan)
        ddp = DistributedDataParallel(
            model, device_ids=None if device.index is None else [device.index]
        )
        optimizer = make_optimizer(plan.settings.optimizer, model)
        for step in range(args.steps):
            memory.step(step)
            inputs = batch(workload, plan, rank, step, device)
            loss = loss_of(workload, ddp, inputs)
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
