"""The ops a training step runs, to hold the fake step to the real one.

Every figure ckptplan predicts comes from a step on fake tensors. Libraries that read a
tensor's values to choose a branch take another path on a fake tensor (transformers built a
float causal mask in every decoder layer that the real step never builds): the profile then
describes a step nobody runs, and the error hides in the prediction. The check is direct: the
fake step's sequence of aten ops, with the shapes and dtypes of what each returns, must equal a
real step's, op for op.

Example:
    >>> a = [OpCall("aten.mm.default", (((8, 8), "torch.float32"),))]
    >>> first_divergence(a, a) is None
    True
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ckptplan.huggingface import training_conventions
from ckptplan.loading import Workload, build_fake, call_model
from ckptplan.profiling.fakepaths import answering, real_step_paths
from ckptplan.quietlogs import torch_logs_quieted


@dataclass(frozen=True)
class OpCall:
    """One aten op of the step and the (shape, dtype) of each tensor it returned."""

    op: str
    outputs: tuple[tuple[tuple[int, ...], str], ...]

    def __str__(self) -> str:
        shapes = ", ".join(f"{list(s)} {d.removeprefix('torch.')}" for s, d in self.outputs)
        return f"{self.op} -> {shapes or 'nothing'}"


class _OpLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[OpCall] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        # A metadata query (``prim.device``) only fake tensors dispatch; a library question
        # the fake step answers unrun (``fakepaths``) runs only in the real step.
        if func.namespace == "prim" or answering():
            return out
        tensors = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.calls.append(OpCall(str(func), tuple((tuple(t.shape), str(t.dtype)) for t in tensors)))
        return out


@torch_logs_quieted()
def step_ops(workload: Workload, real: bool, batch_size: int | None = None) -> list[OpCall]:
    """The ops of one forward and backward of the model file's model, on fake tensors (as the
    profile runs it) or on real ones."""
    with nullcontext() if real else FakeTensorMode(allow_non_fake_inputs=True):
        torch.manual_seed(0)
        model = workload.build() if real else build_fake(workload)
        inputs, _ = training_conventions(model, workload.inputs(batch_size))
        model.train()
        log = _OpLog()
        with real_step_paths(inputs), log:
            loss = workload.loss(call_model(model, inputs))
            loss.backward()
    return log.calls


def first_divergence(fake: list[OpCall], real: list[OpCall]) -> str | None:
    """Where the two sequences part, in one line; None when they are the same."""
    for index, (a, b) in enumerate(zip(fake, real, strict=False)):
        if a != b:
            return f"op {index}: the fake step ran {a}, the real step {b}"
    if len(fake) != len(real):
        shorter = min(len(fake), len(real))
        name, rest = ("fake", fake) if len(fake) > shorter else ("real", real)
        return f"op {shorter}: only the {name} step goes on, with {rest[shorter]}"
    return None
