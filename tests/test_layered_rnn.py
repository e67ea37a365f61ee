"""A stacked recurrent module run layer by layer computes what it computed, bit for bit, and
keeps its parameters, ``state_dict`` and fingerprint: only then may a plan checkpoint its
layers one by one (``ckptplan.applying.layered_rnn``)."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
import torch
from torch import nn

from ckptplan.applying.layered_rnn import RecurrentLayer, layer_by_layer, splits
from ckptplan.fingerprint import model_fingerprint

STACKS = {
    "lstm": lambda: nn.LSTM(8, 6, num_layers=3, batch_first=True),
    "lstm bidirectional": lambda: nn.LSTM(8, 6, num_layers=3, bidirectional=True),
    "lstm projected": lambda: nn.LSTM(8, 6, num_layers=2, proj_size=4, batch_first=True),
    "lstm no bias": lambda: nn.LSTM(8, 6, num_layers=2, bias=False),
    "gru bidirectional": lambda: nn.GRU(8, 6, num_layers=3, bidirectional=True),
    "rnn relu": lambda: nn.RNN(8, 6, num_layers=2, nonlinearity="relu", batch_first=True),
}


def _loss(output: tuple[torch.Tensor, Any]) -> torch.Tensor:
    out, state = output
    states = state if isinstance(state, tuple) else (state,)
    return out.square().sum() + sum(s.square().sum() for s in states)


def _grads(rnn: nn.Module, x: torch.Tensor, hx: Any) -> list[torch.Tensor]:
    x = x.clone().requires_grad_()
    output = rnn(x, hx)
    return [output[0], *torch.autograd.grad(_loss(output), [x, *rnn.parameters()])]


def _state(rnn: nn.RNNBase, batch: int) -> Any:
    rows = rnn.num_layers * (2 if rnn.bidirectional else 1)
    h = torch.randn(rows, batch, rnn.proj_size or rnn.hidden_size)
    return (h, torch.randn(rows, batch, rnn.hidden_size)) if rnn.mode == "LSTM" else h


@pytest.mark.parametrize("name", STACKS)
@pytest.mark.parametrize("given_state", [False, True])
def test_layer_by_layer_gives_the_same_outputs_and_gradients(name: str, given_state: bool) -> None:
    torch.manual_seed(0)
    stacked = STACKS[name]()
    layered = copy.deepcopy(stacked)
    assert layer_by_layer(layered) == 1
    assert len(layered.layers) == stacked.num_layers
    x = torch.randn(5, 7, 8)
    hx = _state(stacked, 5 if stacked.batch_first else 7) if given_state else None
    for expected, got in zip(_grads(stacked, x, hx), _grads(layered, x, hx), strict=True):
        assert torch.equal(expected, got)


def test_an_unbatched_sequence_runs_as_torch_runs_it() -> None:
    stacked = STACKS["lstm"]()
    layered = copy.deepcopy(stacked)
    layer_by_layer(layered)
    x = torch.randn(7, 8)
    expected, got = stacked(x), layered(x)
    assert torch.equal(expected[0], got[0]) and all(map(torch.equal, expected[1], got[1]))


def test_the_split_keeps_parameters_state_dict_and_fingerprint() -> None:
    model = nn.Sequential(nn.Linear(8, 8), STACKS["lstm bidirectional"]())
    before = model_fingerprint(model), list(model.state_dict()), list(model.parameters())
    layer_by_layer(model)
    assert isinstance(model[1].layers[0], RecurrentLayer)
    assert before == (model_fingerprint(model), list(model.state_dict()), list(model.parameters()))
    assert layer_by_layer(model) == 0, "a split module is left as it is"


def test_copies_compute_with_their_own_weights() -> None:
    """A deep copy or a pickled copy of a split stack runs on the copy's parameters."""
    stacked = STACKS["lstm"]()
    layer_by_layer(stacked)
    x = torch.randn(2, 3, 8)
    for copied in (copy.deepcopy(stacked), pickle.loads(pickle.dumps(stacked))):
        with torch.no_grad():
            for p in copied.parameters():
                p.zero_()
        assert copied.layers[1].owner is copied
        assert not copied(x)[0].any() and stacked(x)[0].any()


@pytest.mark.parametrize(
    "module",
    [
        nn.LSTM(4, 4, num_layers=1),
        nn.LSTM(4, 4, num_layers=2, dropout=0.2),
        type("MyLSTM", (nn.LSTM,), {})(4, 4, num_layers=2),
    ],
    ids=["one layer", "dropout", "subclass"],
)
def test_what_is_not_split(module: nn.Module) -> None:
    assert not splits(module)
    assert layer_by_layer(module) == 0 and not hasattr(module, "layers")
