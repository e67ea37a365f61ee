"""Stacked recurrent layers as calls of their own, so a plan can checkpoint them one by one.

``nn.LSTM(num_layers=4)`` is one module and one kernel call. Checkpointed whole, its backward
recomputes all four layers at once, just where an unchecked step peaks, so it saves nothing;
its layers cannot be units. ``layer_by_layer`` gives each layer a call: the module's class
becomes ``LayeredLSTM`` (``LayeredGRU``, ``LayeredRNN``), a subclass whose forward calls
``layers[k]`` in turn, each running torch's one-layer kernel over the module's own parameters.

Parameters, ``state_dict`` keys and results stay as they were: the stacked kernel runs the same
one-layer kernel per layer, and the layers (``RecurrentLayer``) hold nothing of their own.
Profiling and ``apply`` both split, so the units a profile saw exist when its plan is applied;
fingerprints ignore the split (``unsplit_structure``).

Only exact ``nn.LSTM``/``nn.GRU``/``nn.RNN`` of several layers with no dropout between layers
are split: on a GPU that dropout is cuDNN's, whose random draws a layer-by-layer run cannot
repeat. A packed sequence runs the stacked kernel as before: no layer calls, none planned.

Example:
    >>> lstm = torch.nn.LSTM(8, 8, num_layers=3, batch_first=True)
    >>> layer_by_layer(lstm)
    1
    >>> type(lstm).__name__, len(lstm.layers), sorted(lstm.state_dict())[:2]
    ('LayeredLSTM', 3, ['bias_hh_l0', 'bias_hh_l1'])
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence

_KERNELS: dict[str, Callable[..., Any]] = {
    "LSTM": torch.lstm,
    "GRU": torch.gru,
    "RNN_TANH": torch.rnn_tanh,
    "RNN_RELU": torch.rnn_relu,
}
"""``RNNBase.mode`` -> torch's kernel of that recurrence, as ``nn.LSTM``'s forward calls it."""


class RecurrentLayer(nn.Module):
    """Layer ``index`` of a stacked recurrent module, run on its owner's weights.

    Called as ``layer(x, state)`` with the *whole* stack's initial state, so every layer takes
    the same arguments but the first: a region may join consecutive layers like any blocks.
    """

    def __init__(self, owner: nn.RNNBase, index: int) -> None:
        super().__init__()
        self.index = index
        # A plain attribute, not a submodule: the owner holds this layer, not the reverse.
        object.__setattr__(self, "owner", owner)
        directions = ("", "_reverse") if owner.bidirectional else ("",)
        kinds = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if owner.bias else [])
        if getattr(owner, "proj_size", 0) > 0:
            kinds.append("weight_hr")
        self.weight_names = [f"{kind}_l{index}{d}" for d in directions for kind in kinds]

    def forward(self, x: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        owner: nn.RNNBase = self.__dict__["owner"]
        weights = [getattr(owner, name) for name in self.weight_names]
        directions = 2 if owner.bidirectional else 1
        rows = slice(self.index * directions, (self.index + 1) * directions)
        kernel = _KERNELS[owner.mode]
        options = (owner.bias, 1, 0.0, owner.training, owner.bidirectional, owner.batch_first)
        if owner.mode == "LSTM":
            out, h, c = kernel(x, (state[0][rows], state[1][rows]), weights, *options)
            return out, (h, c)
        out, h = kernel(x, state[rows], weights, *options)
        return out, h


def splits(module: nn.Module) -> bool:
    """Whether ``layer_by_layer`` runs ``module``'s layers one by one."""
    return (
        type(module) in _LAYERED
        and isinstance(module, nn.RNNBase)
        and module.num_layers > 1
        and module.dropout == 0
    )


class _Layered:
    """The forward of a split stack: each layer a call, the states gathered as torch's."""

    layers: nn.ModuleList

    def forward(self, input: Any, hx: Any = None) -> Any:
        if isinstance(input, PackedSequence):
            return super().forward(input, hx)  # type: ignore[misc]
        rnn: Any = self
        batched = input.dim() == 3
        batch_dim = 0 if rnn.batch_first else 1
        if not batched:
            input = input.unsqueeze(batch_dim)
            if hx is not None:
                hx = tuple(h.unsqueeze(1) for h in hx) if rnn.mode == "LSTM" else hx.unsqueeze(1)
        if hx is None:
            hx = _zero_state(rnn, input, input.shape[batch_dim])
        out, finals = input, []
        for layer in self.layers:
            out, final = layer(out, hx)
            finals.append(final)
        if rnn.mode == "LSTM":
            state: Any = tuple(torch.cat(parts) for parts in zip(*finals, strict=True))
        else:
            state = torch.cat(finals)
        if not batched:
            out = out.squeeze(batch_dim)
            state = tuple(s.squeeze(1) for s in state) if rnn.mode == "LSTM" else state.squeeze(1)
        return out, state


def _zero_state(rnn: Any, x: torch.Tensor, batch: int) -> Any:
    rows = rnn.num_layers * (2 if rnn.bidirectional else 1)
    width = rnn.proj_size if getattr(rnn, "proj_size", 0) > 0 else rnn.hidden_size
    h = torch.zeros(rows, batch, width, dtype=x.dtype, device=x.device)
    if rnn.mode != "LSTM":
        return h
    return h, torch.zeros(rows, batch, rnn.hidden_size, dtype=x.dtype, device=x.device)


class LayeredLSTM(_Layered, nn.LSTM):
    """An ``nn.LSTM`` whose layers run as calls of their own (``layer_by_layer``)."""


class LayeredGRU(_Layered, nn.GRU):
    """An ``nn.GRU`` whose layers run as calls of their own (``layer_by_layer``)."""


class LayeredRNN(_Layered, nn.RNN):
    """An ``nn.RNN`` whose layers run as calls of their own (``layer_by_layer``)."""


_LAYERED: dict[type[nn.RNNBase], type[nn.RNNBase]] = {
    nn.LSTM: LayeredLSTM,
    nn.GRU: LayeredGRU,
    nn.RNN: LayeredRNN,
}


def layer_by_layer(model: nn.Module) -> int:
    """Split every stacked recurrent module of ``model`` in place (see the module docstring);
    the number split. Idempotent: a split module is left as it is."""
    split = 0
    for module in list(model.modules()):
        if isinstance(module, nn.RNNBase) and splits(module):
            module.__class__ = _LAYERED[type(module)]
            layers = [RecurrentLayer(module, k) for k in range(module.num_layers)]
            module.add_module("layers", nn.ModuleList(layers))
            split += 1
    return split


def unsplit_structure(model: nn.Module) -> Iterator[tuple[str, str]]:
    """Each module's path and class name as they were before ``layer_by_layer``."""
    for path, module in model.named_modules():
        if isinstance(module, RecurrentLayer) or _holds_layers(module):
            continue
        kind = type(module)
        if isinstance(module, _Layered):
            kind = next(base for base in kind.__mro__ if base in _LAYERED)
        yield path, kind.__name__


def _holds_layers(module: nn.Module) -> bool:
    return isinstance(module, nn.ModuleList) and any(isinstance(m, RecurrentLayer) for m in module)
