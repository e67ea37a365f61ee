"""The tensors in a call's nested arguments, and the model set up as training runs it.

Applied regions and the profiler both need these; they live with the runtime so that a training
job's ``ckptplan.apply`` never imports the profiler for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def first_tensor(tree: Any) -> torch.Tensor | None:
    """The first tensor of a nested structure (a block's hidden state in its args or output)."""
    return next(input_tensors(tree), None)


def input_tensors(inputs: object) -> Iterator[torch.Tensor]:
    """Every tensor of a nested structure of tuples, lists and dicts, in order."""
    if isinstance(inputs, torch.Tensor):
        yield inputs
    elif isinstance(inputs, tuple | list):
        for item in inputs:
            yield from input_tensors(item)
    elif isinstance(inputs, dict):
        for item in inputs.values():
            yield from input_tensors(item)


def training_conventions(model: torch.nn.Module, inputs: Any = None) -> tuple[Any, tuple[str, ...]]:
    """The model and batch set up as a training step runs them, and what was changed.

    Hugging Face decoders default to ``use_cache=True``: in training the key/value cache is
    wasted memory, and a recomputed block would append to it again (checkpoint then refuses
    the recomputed values' metadata). Hugging Face's own checkpointing turns it off, so does
    this, on every config in the model and in the batch's keyword arguments.
    """
    cached = [
        m
        for m in model.modules()
        if getattr(getattr(m, "config", None), "use_cache", False) is True
    ]
    for module in cached:
        module.config.use_cache = False
    asked = isinstance(inputs, dict) and inputs.get("use_cache") is True
    if asked:
        inputs = {**inputs, "use_cache": False}
    notes = ("the key/value cache (use_cache) is off, as in training",) if cached or asked else ()
    return inputs, notes
