"""An MLP of residual blocks with LayerDrop, as fairseq and Hugging Face write it: a scalar draw
before each block decides whether it runs (``LAYERDROP_DRAW`` picks torch's or Python's
generator, or ``none`` for no LayerDrop), and dropout inside the blocks, so a step's gradients
depend on every draw's order."""

import os
import random

import torch
from torch import nn

WIDTH = 64
P = float(os.environ.get("LAYERDROP", "0.3"))
DRAW = os.environ.get("LAYERDROP_DRAW", "torch")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Dropout(0.1), nn.Linear(WIDTH, WIDTH)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)


class LayerDropMLP(nn.Module):
    def __init__(self, layerdrop: float = P) -> None:
        super().__init__()
        self.layerdrop = layerdrop
        self.layers = nn.ModuleList(Block() for _ in range(12))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if DRAW != "none":
                draw = torch.rand([]) if DRAW == "torch" else random.random()
                if self.training and draw < self.layerdrop:
                    continue
            x = layer(x)
        return self.head(x).square().mean()


def build_model() -> nn.Module:
    return LayerDropMLP()


def example_inputs(batch_size: int = 256) -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch_size, WIDTH),)
