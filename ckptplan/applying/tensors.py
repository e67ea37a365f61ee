"""The tensors in a call's nested arguments.

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
