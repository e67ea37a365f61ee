"""Checks an applied plan makes while it trains: the batch it was made for, and no second
checkpointing switched on inside its regions.

A plan's peak holds for the batch it was profiled with. A larger batch (or longer sequences)
raises every activation with it, so the first forward with more input elements than the plan
assumed warns, once per shape. Hugging Face's own checkpointing, switched on after ``apply``
(``model.activation_checkpointing_enable()``, or ``Trainer`` with
``TrainingArguments(activation_checkpointing=True)``), would checkpoint the planned layers a
second time inside their regions: a region refuses to run then.

The two warnings go through ``warnings`` alone (``BatchWarning``, ``TargetWarning``), not the log
as well: the fix is the caller's, so they read it once and can filter it by its class;
``logging.captureWarnings(True)`` sends it to the log instead.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ckptplan.applying.tensors import input_tensors
from ckptplan.errors import CkptplanError, option
from ckptplan.huggingface import CHECKPOINTING_SWITCHES, checkpointing_on


class BatchWarning(UserWarning):
    """The model runs a batch the plan was not made for."""


def _leaves(signature: Any) -> Iterator[tuple[list[int], str]]:
    """The (shape, dtype) pairs of an ``inputs_signature`` (a plan's record of its batch)."""
    pair = isinstance(signature, list) and len(signature) == 2
    if pair and isinstance(signature[0], list) and str(signature[1]).startswith("torch."):
        yield signature[0], signature[1]
        return
    if isinstance(signature, list | tuple):
        for item in signature:
            yield from _leaves(item)
    elif isinstance(signature, dict):
        for item in signature.values():
            yield from _leaves(item)


def _size(signature: Any) -> tuple[int, set[str]]:
    pairs = list(_leaves(signature))
    return sum(math.prod(shape) for shape, _ in pairs), {dtype for _, dtype in pairs}


class BatchGuard:
    """A forward pre-hook on the planned model: warns when a batch outgrows the plan's."""

    def __init__(self, planned: Any) -> None:
        self.elements, self.dtypes = _size(planned)
        self.seen: set[tuple[tuple[tuple[int, ...], str], ...]] = set()

    def __call__(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        if torch.compiler.is_compiling() or not self.elements:
            return
        # A scalar is no batch (Trainer passes the step's token count, num_items_in_batch).
        batch = [t for t in input_tensors((args, kwargs)) if t.dim()]
        key = tuple((tuple(t.shape), str(t.dtype)) for t in batch)
        elements = sum(math.prod(shape) for shape, _ in key)
        dtypes = {dtype for _, dtype in key}
        if key in self.seen or (elements <= self.elements and dtypes <= self.dtypes):
            return
        self.seen.add(key)
        what = (
            f"{elements:,} input elements against the {self.elements:,} it was made for"
            if elements > self.elements
            else f"inputs in {', '.join(sorted(dtypes - self.dtypes))}, not the plan's "
            f"{', '.join(sorted(self.dtypes))}"
        )
        message = (
            f"ckptplan: this batch has {what}, so the plan's predicted peak no longer holds; "
            f"solve again with this batch ({option('batch_size')}, or the example inputs it "
            "will run)"
        )
        warnings.warn(message, BatchWarning, stacklevel=3)


class TargetWarning(UserWarning):
    """The model trains on another kind of device than the plan was made for."""


class TargetGuard:
    """A forward pre-hook on the planned model: warns once when the first batch it sees lies
    on another kind of device than the plan's target (a plan for an H100 priced GPU kernels
    and memory; on the CPU its peak does not hold, and the reverse). ``apply`` may rightly
    come before ``model.to("cuda")``, so the check waits for the first forward."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.kind = "cpu" if target == "cpu" else "cuda"
        self.checked = False

    def __call__(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        if self.checked or torch.compiler.is_compiling():
            return
        tensor = next(input_tensors((args, kwargs)), None)
        if tensor is None:
            return
        self.checked = True
        if tensor.device.type == self.kind:
            return
        here = tensor.device.type
        fix = option("target", "cpu") if here == "cpu" else f"{option('target')} naming this GPU"
        message = (
            f"ckptplan: the plan was made for {self.target}, but this step runs on {here}, so "
            f"its predicted peak does not hold here; solve again with {fix}"
        )
        warnings.warn(message, TargetWarning, stacklevel=3)


GUARD_WARNINGS = (BatchWarning, TargetWarning)
"""What the guards warn of; ckptplan's own fake runs of a plan ignore them."""


def refuse_second_checkpointing(region: str, layers: Iterable[torch.nn.Module]) -> None:
    """Raise when Hugging Face checkpointing was switched on inside a planned region (its
    ``checkpointing_layers``)."""
    for layer in layers:
        if checkpointing_on(layer) and layer.training:
            raise CkptplanError(
                f"Hugging Face checkpointing was switched on inside region {region} after "
                f"ckptplan.apply ({CHECKPOINTING_SWITCHES}), so its layers would be "
                "checkpointed twice: leave it off, the plan checkpoints them"
            )
