"""Train with a ckptplan plan in one process: ``python examples/train_plain.py --budget 60%``.

``ckptplan.solve`` profiles one training step on fake tensors and picks the plan of least
recomputation under the budget; ``ckptplan.apply`` checkpoints the planned blocks in place.
Runs on one GPU if there is one, else on the CPU. Any model file works (``--model``).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

import ckptplan
from ckptplan.loading import call_model, load_model_file

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "sample_models" / "gpt.py")
    parser.add_argument("--budget", default="60%", help="peak memory of a step, e.g. 2GB or 60%")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    plan = ckptplan.solve(args.model, budget=args.budget, batch_size=args.batch_size)
    workload = load_model_file(args.model)
    torch.manual_seed(0)
    model = workload.build().to(device).train()
    model = ckptplan.apply(model, plan)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(args.steps):
        inputs = workload.inputs(plan.settings.batch_size)
        if isinstance(inputs, dict):
            inputs = {k: v.to(device) for k, v in inputs.items()}
        else:
            inputs = tuple(v.to(device) for v in inputs)
        loss = workload.loss(call_model(model, inputs))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        logging.info("step %d: loss %.4f", step, loss.item())
    logging.info("%s; %d recomputations", model.ckptplan_applied, model.ckptplan_applied.recomputed)


if __name__ == "__main__":
    main()
