"""Gradients of a candidate against the baseline's, after the same seeded forward and backward
(dropout included), so that a plan that recomputes must give the unchecked step's numbers."""

from __future__ import annotations

from typing import Any

import torch

from ckptplan.applying.tensors import input_tensors
from ckptplan.callerstate import seed_all
from ckptplan.loading import Workload, call_model
from ckptplan.profiling.training import autocast_context


def seeded_grads(
    model_file: Workload, model: torch.nn.Module, inputs: Any, autocast: str | None
) -> dict[str, torch.Tensor]:
    """The parameters' gradients of one seeded forward and backward, by name; the model's own
    gradients are dropped again."""
    seed_all(1234)
    model.zero_grad(set_to_none=True)
    with autocast_context(autocast, next(input_tensors(inputs)).device.type):
        loss = model_file.loss(call_model(model, inputs))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def max_grad_abs_diff(
    model_file: Workload,
    baseline: torch.nn.Module,
    candidate: torch.nn.Module,
    inputs: Any,
    autocast: str | None,
) -> float:
    """The largest absolute difference between a baseline gradient and the candidate's; both
    sets are freed on return, before any peak is measured."""
    reference = seeded_grads(model_file, baseline, inputs, autocast)
    got = seeded_grads(model_file, candidate, inputs, autocast)
    return max(
        ((reference[n].float() - got[n].float()).abs().max().item() for n in reference),
        default=0.0,
    )
