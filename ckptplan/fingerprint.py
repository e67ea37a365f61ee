"""A model's identity for plans: its module tree (as built, before ``layer_by_layer``),
parameter shapes and dtypes.

A plan names modules by path; applied to a model with another structure it would wrap the
wrong modules or none, so ``apply`` compares fingerprints first.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

from ckptplan.applying.layered_rnn import unsplit_structure
from ckptplan.errors import CkptplanError, option


def model_fingerprint(model: torch.nn.Module) -> dict[str, Any]:
    modules = [[path, kind] for path, kind in unsplit_structure(model)]
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


def check_model_matches(model: torch.nn.Module, plan: Any, force: bool = False) -> None:
    """Refuse a plan made for another model (structure or parameter shapes), unless forced."""
    fingerprint = model_fingerprint(model)
    if fingerprint["hash"] != plan.fingerprint["hash"] and not force:
        raise CkptplanError(
            f"the plan was made for another model ({plan.model}: {plan.fingerprint['class']}, "
            f"{plan.fingerprint['parameters']:,} parameters; this is {fingerprint['class']}, "
            f"{fingerprint['parameters']:,}); re-solve for this model or pass "
            f"{option('force', True)}"
        )
