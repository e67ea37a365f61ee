"""LSTM language model: embedding, one ``nn.LSTM`` of 4 layers, linear head over the vocabulary.

Plain PyTorch with its defaults (no dropout between layers, unidirectional, no projection,
``batch_first=True``). Sizes: vocab 1024, embedding and hidden 256, 8 sequences of 128 tokens.
The labels are the inputs shifted by one token. The recurrent layers are one module, which
ckptplan runs layer by layer (``ckptplan.applying.layered_rnn``), so its units are
``lstm.layers.0``-``3``; ``lstm_stack.py`` is the same model with its layers as a
``ModuleList`` of one-layer LSTMs.
"""

import torch
import torch.nn as nn

VOCAB = 1024
WIDTH = 256
LAYERS = 4
SEQ = 128


class LSTMLanguageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.lstm = nn.LSTM(WIDTH, WIDTH, num_layers=LAYERS, batch_first=True)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(input_ids))
        logits = self.head(hidden)
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def build_model() -> nn.Module:
    return LSTMLanguageModel()


def example_inputs(batch_size: int = 8) -> dict:
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ + 1))
    return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}
