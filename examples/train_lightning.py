"""Train with PyTorch Lightning and a ckptplan plan: ``python examples/train_lightning.py``.

Order of wrapping: the ``LightningModule``'s ``configure_model`` hook calls
``ckptplan.autoplan(self.model, batch, budget=...)`` (one call: solved on fake
tensors, or read from the plan cache), since Lightning runs that hook before its strategy wraps
the model (DDP, FSDP, ``torch.compile`` of the module afterwards). Lightning calls the hook
again for each later ``validate``/``test``/``predict``, so it applies the plan once.

Keep Lightning and the model's own activation checkpointing off (no
``model.activation_checkpointing_enable()``): the plan checkpoints the planned layers, and a
second checkpointing inside them is refused with one ``CkptplanError`` on the first forward.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import lightning
import torch

import ckptplan
from ckptplan.loading import load_model_file

MODEL_FILE = Path(__file__).resolve().parent / "tiny_gpt2.py"
BATCH_SIZE = 4


class LanguageModel(lightning.LightningModule):
    """A causal language model trained on its own tokens, checkpointed as ckptplan plans it
    under ``budget`` (unchecked when None)."""

    def __init__(
        self, budget: str | None, example_inputs: dict[str, Any], cache_dir: str | Path | None
    ) -> None:
        super().__init__()
        self.model = load_model_file(MODEL_FILE).build()
        self.budget = budget
        self.example_inputs = example_inputs
        self.cache_dir = cache_dir
        self.first_gradients: dict[str, torch.Tensor] = {}

    def configure_model(self) -> None:
        if self.budget is None or getattr(self.model, "ckptplan_applied", None) is not None:
            return
        ckptplan.autoplan(
            self.model,
            self.example_inputs,
            budget=self.budget,
            cache_dir=self.cache_dir,
        )

    def training_step(self, batch: dict[str, torch.Tensor], index: int) -> torch.Tensor:
        loss = self.model(**batch).loss
        logging.info("step %d: loss %.4f", index, loss.item())
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if not self.first_gradients:
            self.first_gradients = {n: p.grad.clone() for n, p in self.model.named_parameters()}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def train(budget: str | None, steps: int, cache_dir: str | Path | None = None) -> LanguageModel:
    """Train ``steps`` steps on one device; the module keeps the first step's gradients."""
    lightning.seed_everything(1, verbose=False)
    ids = load_model_file(MODEL_FILE).inputs(BATCH_SIZE * steps)["input_ids"]
    lightning.seed_everything(0, verbose=False)
    batch = {"input_ids": ids[:BATCH_SIZE], "labels": ids[:BATCH_SIZE]}
    module = LanguageModel(budget, batch, cache_dir)
    samples = [{"input_ids": row, "labels": row} for row in ids]
    trainer = lightning.Trainer(
        accelerator="auto",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, torch.utils.data.DataLoader(samples, batch_size=BATCH_SIZE))
    return module


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
