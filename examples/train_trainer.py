"""Fine-tune with Hugging Face's ``Trainer`` and a ckptplan plan: ``python
examples/train_trainer.py --budget 70%``.

Order of wrapping: ``ckptplan.autoplan(model, batch, budget=...)`` first (one call:
it solves on fake tensors, or reads the plan cached for these settings, and checkpoints the
planned layers in place), then ``Trainer(model=model, ...)``, whose own wrapping (DDP under
torchrun, FSDP through accelerate, ``torch.compile`` with ``torch_compile=True``) comes after,
when it trains.

Keep ``TrainingArguments(activation_checkpointing=False)`` (the default; ``gradient_checkpointing``
is its deprecated alias): switched on, it would checkpoint the planned layers a second time, and
the first forward raises one ``CkptplanError`` saying so.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

import ckptplan
from ckptplan.loading import load_model_file

MODEL_FILE = Path(__file__).resolve().parent / "tiny_gpt2.py"
BATCH_SIZE = 4


@dataclass
class FirstGradients(TrainerCallback):
    """Keeps the first optimizer step's gradients, to compare runs with and without a plan."""

    gradients: dict[str, torch.Tensor] = field(default_factory=dict)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.gradients:
            model = kwargs["model"]
            self.gradients = {n: p.grad.clone() for n, p in model.named_parameters()}


def training_arguments(output_dir: str, steps: int, **overrides: Any) -> TrainingArguments:
    settings: dict[str, Any] = {
        "output_dir": output_dir,
        "max_steps": steps,
        "per_device_train_batch_size": BATCH_SIZE,
        "learning_rate": 1e-3,
        "use_cpu": not torch.cuda.is_available(),
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 1,
        "dataloader_num_workers": 0,
        "seed": 0,
        **overrides,
    }
    return TrainingArguments(**settings)


def train(
    budget: str | None, steps: int, output_dir: str, cache_dir: str | Path | None = None
) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """Train ``steps`` steps (without a plan when ``budget`` is None); the model and the first
    step's gradients."""
    workload = load_model_file(MODEL_FILE)
    torch.manual_seed(1)
    ids = workload.inputs(BATCH_SIZE * steps)["input_ids"]
    torch.manual_seed(0)
    model = workload.build()
    if budget is not None:
        # The batch the Trainer's collator stacks, which the plan is solved for.
        batch = {"input_ids": ids[:BATCH_SIZE], "labels": ids[:BATCH_SIZE]}
        model = ckptplan.autoplan(model, batch, budget=budget, cache_dir=cache_dir)
    first = FirstGradients()
    trainer = Trainer(
        model=model,
        args=training_arguments(output_dir, steps),
        train_dataset=[{"input_ids": row, "labels": row} for row in ids],
        callbacks=[first],
    )
    trainer.train()
    return model, first.gradients


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="70%", help="peak memory of a step, e.g. 2GB or 70%")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as output_dir:
        model, _ = train(args.budget, args.steps, output_dir)
    applied = model.ckptplan_applied
    logging.info("%s; %d recomputations", applied, applied.recomputed)


if __name__ == "__main__":
    main()
