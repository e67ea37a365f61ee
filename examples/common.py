"""What the example scripts share: the model file, per-rank batches, memory, and a report.

The scripts are short training loops; this module keeps the bookkeeping out of them. Each rank
draws its own batch and dropout masks from seeds that depend on (step, rank) only, so a
single process that accumulates the ranks' batches one after another computes the same loss
and gradients: the tests compare the two.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist

from ckptplan.errors import CkptplanError
from ckptplan.loading import Inputs, Workload, call_model, load_model_file
from ckptplan.planning.distributed import RankMemory
from ckptplan.values.plan import Plan

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "sample_models" / "gpt.py"


def arguments(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("plan", type=Path, help="plan.json from `ckptplan solve`")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="the model file")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--report", type=Path, default=None, help="write rank<r>.pt here")
    return parser.parse_args()


def start_ranks() -> tuple[int, int, torch.device]:
    """Join torchrun's process group: NCCL on GPUs, gloo on CPU."""
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl")
        device = torch.device("cuda", local)
    else:
        dist.init_process_group("gloo")
        device = torch.device("cpu")
    rank = dist.get_rank()
    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(message)s")
    return rank, dist.get_world_size(), device


def load(path: Path) -> Workload:
    return load_model_file(path)


def check_layout(plan: Plan, world: int, parallel: str) -> None:
    """Refuse a plan made for another number of ranks or another kind of parallelism."""
    made = (plan.settings.world_size, plan.settings.parallel)
    if made != (world, parallel):
        raise CkptplanError(
            f"the plan's budget is per rank for world size {made[0]} with {made[1] or 'no'} "
            f"data parallelism, but this is {world} ranks with {parallel}; re-solve it with "
            f"--world-size {world} --{parallel}"
        )


def batch(workload: Workload, plan: Plan, rank: int, step: int, device: torch.device) -> Inputs:
    """This rank's batch of ``step`` (the plan's per-rank batch size); seeds dropout after."""
    torch.manual_seed(10_000 + 100 * step + rank)
    inputs = workload.inputs(plan.settings.batch_size)
    torch.manual_seed(20_000 + 100 * step + rank)
    if isinstance(inputs, dict):
        return {k: v.to(device) for k, v in inputs.items()}
    return tuple(v.to(device) for v in inputs)


def microbatch_seed(step: int, stage: int, microbatch: int) -> int:
    """The dropout seed of a pipeline stage's forward of one microbatch."""
    return 20_000 + 1_000 * step + 100 * stage + microbatch


def pipeline_batch(
    shapes: list[torch.Tensor], size: int, step: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A pipeline step's whole batch of tokens and targets, the same on every rank: shaped as
    the first stage's input, drawn below the last stage's output width (the vocabulary)."""
    generator = torch.Generator().manual_seed(10_000 + step)
    vocab = shapes[-1].shape[-1]
    tokens = torch.randint(0, vocab, (size, *shapes[0].shape[1:]), generator=generator)
    targets = torch.randint(0, vocab, tokens.shape, generator=generator)
    return tokens.to(device), targets.to(device)


def loss_of(workload: Workload, model: torch.nn.Module, inputs: Inputs) -> torch.Tensor:
    return workload.loss(call_model(model, inputs))


class Memory:
    """Peak bytes of one rank's step: CUDA's allocator statistics, or ``RankMemory`` on CPU.

    Enter it before the model is built, so parameters and optimizer state count too.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.tracker = RankMemory() if device.type == "cpu" else None
        self.last = ""

    def __enter__(self) -> Memory:
        if self.tracker is not None:
            self.tracker.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.tracker is not None:
            self.tracker.__exit__(kind, value, traceback)

    def step(self, step: int) -> None:
        """Start measuring ``step`` (each step's peak replaces the last)."""
        self.last = f"step {step}"
        if self.tracker is not None:
            self.tracker.mark(self.last)
        else:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        """Peak of the last step started."""
        if self.tracker is not None:
            return self.tracker.phase_peak(self.last)
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device)


@dataclass
class Report:
    """Losses, the first step's gradients and the last step's peak, for the tests.

    The gradients go to disk at once: kept in memory they would count in the next step's peak.
    """

    rank: int
    folder: Path | None
    losses: list[float] = field(default_factory=list)

    def after_backward(self, step: int, loss: torch.Tensor, model: torch.nn.Module) -> None:
        self.losses.append(loss.item())
        if step == 0 and self.folder is not None:
            grads = {name: _full(p.grad) for name, p in model.named_parameters()}
            self.folder.mkdir(parents=True, exist_ok=True)
            torch.save(grads, self.folder / f"grads{self.rank}.pt")

    def write(self, model: torch.nn.Module, plan: Plan, peak: int) -> None:
        applied = model.ckptplan_applied
        logging.info("%s; peak of the last step %.2f MiB", applied.first_backward, peak / 2**20)
        if self.folder is None:
            return
        data: dict[str, Any] = {
            "losses": self.losses,
            "peak": peak,
            "budget": int(plan.budget.bytes),
            "predicted": int(plan.predicted.peak_bytes),
            "applied": str(applied),
            "first_backward": applied.first_backward,
            "recomputed": applied.recomputed,
        }
        torch.save(data, self.folder / f"rank{self.rank}.pt")


def _full(grad: torch.Tensor) -> torch.Tensor:
    """A gradient as one tensor on CPU (FSDP2 keeps each rank's shard as a DTensor)."""
    full = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
    return full.detach().cpu().clone()
