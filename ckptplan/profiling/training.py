"""One training step as ckptplan predicts and measures it: forward, backward, optimizer step."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch

from ckptplan.applying.tensors import input_tensors
from ckptplan.errors import CkptplanError
from ckptplan.huggingface import LAYERDROP, configs
from ckptplan.options import OPTIMIZERS

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

REAL_STEP_MEMORY_FACTOR = 8
"""A real step is taken only if this many times the parameter bytes fit in free memory
(parameters, gradients and AdamW's two moments are four; activations and slack the rest)."""


def fits_real_step(parameter_bytes: int) -> bool:
    """Whether a real training step of a model this size fits this machine's free memory."""
    free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return parameter_bytes * REAL_STEP_MEMORY_FACTOR <= free


def make_optimizer(name: str, model: torch.nn.Module) -> torch.optim.Optimizer | None:
    """The optimizer whose state the budget counts: a shortcut (``sgd`` is SGD with momentum)
    or the dotted path of an optimizer class (``torch.optim.Adafactor``), made with its own
    defaults; its state is whatever its first step allocates."""
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=False)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4, foreach=False)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=False)
    if name == "none":
        return None
    if "." in name:
        optimizer_class = _optimizer_class(name)
        try:
            return optimizer_class(params)
        except TypeError:  # a class with no default learning rate
            return optimizer_class(params, lr=1e-4)
    raise CkptplanError(
        f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}, "
        "or name an optimizer class (torch.optim.Adafactor)"
    )


def _optimizer_class(path: str) -> type[torch.optim.Optimizer]:
    module_name, _, class_name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError):
        raise CkptplanError(f"optimizer {path!r}: no such class to import") from None
    if not (isinstance(found, type) and issubclass(found, torch.optim.Optimizer)):
        raise CkptplanError(f"optimizer {path!r} is not a torch.optim.Optimizer class")
    return found


def optimizer_name(optimizer: str | type[torch.optim.Optimizer]) -> str:
    """What a plan records of ``optimizer``: a shortcut, or an optimizer class's dotted path.

    >>> optimizer_name(torch.optim.Adafactor), optimizer_name("sgd")
    ('torch.optim.Adafactor', 'sgd')
    """
    if isinstance(optimizer, str):
        return optimizer
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        return f"{optimizer.__module__}.{optimizer.__qualname__}"
    raise CkptplanError(
        f"optimizer={optimizer!r}: pass a torch.optim.Optimizer class (torch.optim.AdamW) or "
        f"one of {', '.join(OPTIMIZERS)}"
    )


def dtype_name(dtype: str | torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bf16"``; names pass through (checked where they are used)."""
    if isinstance(dtype, str):
        return dtype
    for name, value in DTYPES.items():
        if dtype == value:
            return name
    raise CkptplanError(f"dtype={dtype}: ckptplan plans for {', '.join(DTYPES)}")


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise CkptplanError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}") from None


def autocast_context(name: str | None, device_type: str) -> AbstractContextManager[Any]:
    """The forward's mixed-precision context (``--autocast bf16``), or nothing."""
    if name is None:
        return nullcontext()
    return torch.autocast(device_type=device_type, dtype=parse_dtype(name))


def cast_model(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Floating parameters and buffers in ``dtype``, shared (tied) parameters kept shared.

    ``Module.to`` swaps tensor subclasses in place and refuses fake tensors, so the profiler
    and the fake run convert through this instead.
    """
    if dtype == torch.float32:
        return model
    converted: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None and param.is_floating_point():
                if id(param) not in converted:
                    converted[id(param)] = torch.nn.Parameter(
                        param.detach().to(dtype), requires_grad=param.requires_grad
                    )
                module._parameters[name] = converted[id(param)]
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.is_floating_point():
                module._buffers[name] = buffer.to(dtype)
    return model


def cast_floating(tree: object, dtype: torch.dtype) -> object:
    """Floating tensors of an input structure in ``dtype``; integer ids stay as they are."""
    if isinstance(tree, torch.Tensor):
        return tree.to(dtype) if tree.is_floating_point() else tree
    if isinstance(tree, tuple | list):
        return type(tree)(cast_floating(t, dtype) for t in tree)
    if isinstance(tree, dict):
        return {k: cast_floating(v, dtype) for k, v in tree.items()}
    return tree


def optimizer_tensors(optimizer: torch.optim.Optimizer | None) -> Iterator[torch.Tensor]:
    if optimizer is None:
        return
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


def persistent_tensors(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, inputs: object
) -> list[torch.Tensor]:
    """What lives across steps: parameters, buffers, optimizer state and the batch."""
    return [
        *model.parameters(),
        *model.buffers(),
        *optimizer_tensors(optimizer),
        *input_tensors(inputs),
    ]


@contextmanager
def every_layer_runs(model: torch.nn.Module) -> Iterator[None]:
    """LayerDrop off while active, on the modules and configs of ``model`` that set it.

    A plan is priced for the step in which every layer runs (``profiling.everyblock``), so a
    step measured against it must run every layer too. Hugging Face models read the
    probability from their config (wav2vec 2.0) or copy it onto the module (BART's
    ``self.layerdrop``); both are set to 0 here and put back on exit. A measured step cannot
    answer the draws themselves as the fake step does: a Python dispatch mode changes how
    autograd accumulates gradients, and so the allocator's peak.
    """
    changed = [
        (owner, name, getattr(owner, name))
        for owner in (*model.modules(), *configs(model))
        for name in LAYERDROP
        if isinstance(getattr(owner, name, None), float) and getattr(owner, name) > 0
    ]
    try:
        for owner, name, _ in changed:
            setattr(owner, name, 0.0)
        yield
    finally:
        for owner, name, value in changed:
            setattr(owner, name, value)
