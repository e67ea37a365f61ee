"""The unchecked model and batch that a measurement compares against, built on the local
device the measurement runs on, seeded so that every candidate starts from the same weights."""

from __future__ import annotations

from typing import Any

import torch

from ckptplan.errors import CkptplanError
from ckptplan.huggingface import training_conventions
from ckptplan.loading import Workload
from ckptplan.profiling.training import cast_floating, cast_model, parse_dtype
from ckptplan.values.plan import PlanSettings


def run_device(device: str | None) -> torch.device:
    """The local device a measurement runs on (default: CUDA where present, else the CPU),
    refused in one line where this machine or this torch build has no such device."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        target = torch.device(device)
    except RuntimeError:
        raise CkptplanError(f"{device!r} is not a device; e.g. cpu, cuda or cuda:1") from None
    if target.type == "cuda":
        if not torch.cuda.is_available():
            build = "has no CUDA (a CPU build)" if torch.version.cuda is None else "sees no GPU"
            raise CkptplanError(f"device {device}: this torch {build}; measure on cpu")
        if target.index is not None and target.index >= torch.cuda.device_count():
            raise CkptplanError(
                f"device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    elif target.type != "cpu":
        raise CkptplanError(f"device {device}: ckptplan measures on cpu or cuda devices")
    return target


def baseline_run(
    model_file: Workload, settings: PlanSettings, target: torch.device
) -> tuple[torch.nn.Module, Any, torch.dtype]:
    """The unchecked model in training mode on ``target``, its batch and the dtype of both,
    as the plan's ``settings`` (dtype, batch size) ask."""
    dtype = parse_dtype(settings.dtype)
    torch.manual_seed(0)
    model = model_file.build()
    torch.manual_seed(0)
    inputs, _ = training_conventions(model, model_file.inputs(settings.batch_size))
    model = cast_model(model, dtype).to(device=target).train()
    return model, cast_floating(_to_device(inputs, target), dtype), dtype


def _to_device(tree: Any, device: torch.device) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, tuple | list):
        return type(tree)(_to_device(t, device) for t in tree)
    if isinstance(tree, dict):
        return {k: _to_device(v, device) for k, v in tree.items()}
    return tree
