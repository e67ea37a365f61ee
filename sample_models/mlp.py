"""A plain MLP: 16 equal-width Linear + GELU blocks with no residuals.

The simplest chain in the suite. Every block takes exactly one tensor and returns one, so the
checkpointing problem is the textbook homogeneous chain: all blocks cost the same to recompute
and keep the same number of bytes for backward (the Linear input and the GELU input). With a
large batch the kept activations dwarf the weights and optimizer state, so the classic
sqrt(n) segment plan applies directly; any solver should find it.
"""

import torch
import torch.nn as nn

WIDTH = 512
N_BLOCKS = 16


class MLPBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.GELU()
        # He init keeps the activations O(1) through the 16 blocks (no residuals to help).
        nn.init.kaiming_normal_(self.fc.weight, nonlinearity="relu")
        nn.init.zeros_(self.fc.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class MLP(nn.Module):
    def __init__(self, width: int = WIDTH, n_blocks: int = N_BLOCKS) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[MLPBlock(width) for _ in range(n_blocks)])
        self.head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def build_model() -> nn.Module:
    return MLP()


def example_inputs(batch_size: int = 4096) -> tuple:
    return (torch.randn(batch_size, WIDTH),)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.square().mean()
