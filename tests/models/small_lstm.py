"""A small LSTM language model for fast tests: four one-layer ``nn.LSTM``s in a ModuleList
(``StackedLSTM``, the model file's model), one ``nn.LSTM`` of four layers (``OneLSTM``), or
four one-layer ``nn.GRU``s (``StackedGRU``)."""

import torch
from torch import nn

VOCAB, WIDTH, LAYERS, SEQ = 128, 64, 4, 64


class StackedLSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(nn.LSTM(WIDTH, WIDTH, batch_first=True) for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for layer in self.layers:
            hidden, _ = layer(hidden)
        return nn.functional.cross_entropy(self.head(hidden).flatten(0, 1), labels.flatten())


class StackedGRU(StackedLSTM):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.GRU(WIDTH, WIDTH, batch_first=True) for _ in range(LAYERS))


class OneLSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.lstm = nn.LSTM(WIDTH, WIDTH, num_layers=LAYERS, batch_first=True)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(input_ids))
        return nn.functional.cross_entropy(self.head(hidden).flatten(0, 1), labels.flatten())


def build_model() -> nn.Module:
    return StackedLSTM()


def example_inputs(batch_size: int = 8) -> dict:
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ + 1))
    return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}
