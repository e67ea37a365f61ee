"""The profiled step runs every block, even in a model that skips blocks at random.

LayerDrop (wav2vec 2.0, HuBERT, the encoder-decoders' ``encoder_layerdrop``) and other random
depth skip a layer when a scalar draw says so: ``if torch.rand([]) < p: skip``. A profile of
one random draw would price that draw's step, and a layer the draw skipped would be missing
from the chain, so the plan would leave it unplanned in every step that runs it. Here every
scalar draw (a ``rand`` of one element) returns the largest value below 1, so a draw compared
against a drop probability keeps its layer, and the step priced is the one in which every
layer runs: the most memory any draw needs.

On fake tensors the value is a constant the fake mode can read back, so ``bool(draw < p)``
needs no real step. Dropout masks and other draws of more than one element are left alone.

Such a draw still dispatches between the blocks, where ``StepRecorder`` sees it: blocks with
random draws (or any other code) between them are never joined in one checkpoint region, since
a region runs its members back to back and would take the draws in another order
(Note [joining blocks]).
"""

from __future__ import annotations

import random
import sys
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SCALAR_DRAWS = frozenset({torch.ops.aten.rand.default, torch.ops.aten.rand_like.default})


class EveryBlockRuns(TorchDispatchMode):
    """While active, scalar ``rand`` draws return the largest value below 1 (see above)."""

    NOTE = (
        "the model draws single random numbers in its forward (LayerDrop or another random "
        "depth): the plan is priced for the step in which every block runs, the most memory "
        "any draw needs, and never joins blocks with a draw between them"
    )

    def __init__(self) -> None:
        super().__init__()
        self.draws = 0
        """Scalar draws answered: when any, the profile says so (``NOTE``)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func not in SCALAR_DRAWS or out.numel() != 1 or not out.is_floating_point():
            return out
        self.draws += 1
        high: Any = 1.0 - torch.finfo(out.dtype).eps / 2
        for _ in range(out.dim()):
            high = [high]
        # Made by torch.tensor, so that a fake mode keeps the value as a readable constant.
        return torch.tensor(high, dtype=out.dtype, device=out.device)


def host_random_state() -> int:
    """A digest of Python's and (if imported) NumPy's global generators: it changes with
    every draw, so a draw between two blocks shows."""
    numpy = sys.modules.get("numpy")
    drawn: tuple[Any, ...] = ()
    if numpy is not None:
        _, keys, position, has_gauss, gauss = numpy.random.get_state()
        drawn = (keys[:4].tobytes(), int(position), int(has_gauss), float(gauss))
    return hash((random.getstate(), drawn))
