"""Fine-tune a Hugging Face causal LM with a ckptplan plan: ``python examples/train_hf.py``.

A plain PyTorch loop over the model of ``examples/hf_llama.py`` (a tiny Llama from a config;
its ``build_model`` is where ``from_pretrained`` goes). The plan is solved on fake tensors and
applied in place: the decoder layers keep their paths and ``state_dict`` keys, so saving and
loading checkpoints is unchanged.

With the ``Trainer``, apply the plan before ``Trainer(model=model, ...)`` and keep
``TrainingArguments(gradient_checkpointing=False)``: ``apply`` refuses a model that already
has Hugging Face gradient checkpointing on, which would checkpoint every layer twice.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

import ckptplan
from ckptplan.loading import load_model_file

MODEL_FILE = Path(__file__).resolve().parent / "hf_llama.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="60%", help="peak memory of a step, e.g. 2GB or 60%")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    plan = ckptplan.solve(MODEL_FILE, budget=args.budget, batch_size=args.batch_size)
    model_file = load_model_file(MODEL_FILE)
    torch.manual_seed(0)
    model = model_file.build().train()
    model = ckptplan.apply(model, plan)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(args.steps):
        loss = model(**model_file.inputs(args.batch_size)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        logging.info("step %d: loss %.4f", step, loss.item())
    logging.info("%s; %d recomputations", model.ckptplan_applied, model.ckptplan_applied.recomputed)


if __name__ == "__main__":
    main()
