"""A model's identity for plans: its module tree, parameter shapes and dtypes.

A plan names modules by path; applied to a model with another structure it would wrap the
wrong modules or none, so ``apply`` compares fingerprints first.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch


def model_fingerprint(model: torch.nn.Module) -> dict[str, Any]:
    modules = [[path, type(m).__name__] for path, m in model.named_modules()]
    params = [[name, list(p.shape), str(p.dtype)] for name, p in model.named_parameters()]
    digest = hashlib.sha256(json.dumps([modules, params]).encode()).hexdigest()[:16]
    return {
        "class": type(model).__name__,
        "modules": len(modules),
        "parameters": sum(p.numel() for p in model.parameters()),
        "hash": digest,
    }


def inputs_signature(inputs: object) -> Any:
    """Shapes and dtypes of the example batch (a plan is made for one batch shape)."""
    if isinstance(inputs, torch.Tensor):
        return [list(inputs.shape), str(inputs.dtype)]
    if isinstance(inputs, tuple | list):
        return [inputs_signature(x) for x in inputs]
    if isinstance(inputs, dict):
        return {k: inputs_signature(v) for k, v in inputs.items()}
    return repr(inputs)
