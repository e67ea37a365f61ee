"""LSTM language model whose recurrent layers are a ``ModuleList`` of one-layer ``nn.LSTM``s.

The same sizes and defaults as ``lstm_lm.py`` (vocab 1024, width 256, 4 layers, 8 sequences
of 128 tokens), with each layer its own module, so the layers are the units to checkpoint
without naming them.
"""

import torch
import torch.nn as nn

VOCAB = 1024
WIDTH = 256
LAYERS = 4
SEQ = 128


class StackedLSTMLanguageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(nn.LSTM(WIDTH, WIDTH, batch_first=True) for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for layer in self.layers:
            hidden, _ = layer(hidden)
        logits = self.head(hidden)
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def build_model() -> nn.Module:
    return StackedLSTMLanguageModel()


def example_inputs(batch_size: int = 8) -> dict:
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ + 1))
    return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}
