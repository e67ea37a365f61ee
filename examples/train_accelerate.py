"""Train with Hugging Face ``accelerate`` and a ckptplan plan: ``python
examples/train_accelerate.py``, or ``torchrun --nproc_per_node 2 examples/train_accelerate.py``
(or ``accelerate launch``) for DDP, over gloo on the CPU.

Order of wrapping: ``ckptplan.autoplan(model, batch, budget=...)`` on the bare model
(one call: solved on fake tensors, or read from the plan cache; across processes the plan is
one rank's, ``world_size``/``parallel``), then ``accelerator.prepare(model, optimizer,
loader)``, which wraps the model in DDP when there is more than one process (and would come
before ``torch.compile``).

FSDP2 (``FullyShardedDataParallelPlugin(fsdp_version=2)``) is not shown: accelerate turns FSDP
on only with a GPU-type backend, and on the CPU a run of several processes is always DDP over
gloo, so it cannot be tested here. On GPUs the order is the same (apply, then prepare). Beware
there that ``auto_wrap_policy="transformer_based_wrap"`` finds the layer class by the first
layer's name: when ckptplan checkpoints that layer (its class is then a same-named subclass),
the layers that no region holds are not sharded on their own; ``fully_shard`` each layer
before ``prepare`` instead (as ``examples/train_fsdp.py`` does).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import NamedTuple

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed

import ckptplan
from ckptplan.loading import load_model_file

MODEL_FILE = Path(__file__).resolve().parent / "tiny_gpt2.py"
BATCH_SIZE = 4


class Run(NamedTuple):
    model: torch.nn.Module
    prepared: torch.nn.Module
    """The model as ``accelerator.prepare`` returned it (DDP around ``model`` across ranks)."""
    gradients: dict[str, torch.Tensor]
    """This rank's gradients of the first step, by the bare model's parameter names."""


def train(budget: str | None, steps: int, cache_dir: str | Path | None = None) -> Run:
    """Train ``steps`` steps, without a plan when ``budget`` is None."""
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    ranks = accelerator.num_processes
    workload = load_model_file(MODEL_FILE)
    set_seed(1)  # the same samples on every rank, which the loader splits between them
    ids = workload.inputs(BATCH_SIZE * ranks * steps)["input_ids"]
    set_seed(0)
    model = workload.build().train()
    if budget is not None:
        batch = {"input_ids": ids[:BATCH_SIZE], "labels": ids[:BATCH_SIZE]}
        strategy = None if accelerator.distributed_type == DistributedType.NO else "ddp"
        model = ckptplan.autoplan(
            model,
            batch,
            budget=budget,
            cache_dir=cache_dir,
            world_size=ranks,
            strategy=strategy,
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    samples = [{"input_ids": row, "labels": row} for row in ids]
    loader = torch.utils.data.DataLoader(samples, batch_size=BATCH_SIZE)
    prepared, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    first: dict[str, torch.Tensor] = {}
    for step, batch in enumerate(loader):
        loss = prepared(**batch).loss
        accelerator.backward(loss)
        if not first:
            first = {name: p.grad.clone() for name, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        logging.info("step %d: loss %.4f", step, loss.item())
    accelerator.end_training()
    return Run(model, prepared, first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="70%", help="peak memory of a step, e.g. 2GB or 70%")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    applied = train(args.budget, args.steps).model.ckptplan_applied
    logging.info("%s; %d recomputations", applied, applied.recomputed)


if __name__ == "__main__":
    main()
