"""A tiny decoder for fast tests: dropout on, keyword arguments into every block."""

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, 4, dropout=0.1, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.drop(self.attn(h, h, h, attn_mask=mask, need_weights=False)[0])
        return x + self.drop(self.mlp(self.norm2(x)))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 64, width: int = 32, depth: int = 6, context: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.embed(idx) + self.pos(torch.arange(t, device=idx.device))
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=idx.device), 1)
        for layer in self.layers:
            x = layer(x, mask=mask)
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


def build_model() -> nn.Module:
    return TinyGPT()


def example_inputs(batch_size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randint(0, 64, (batch_size, 32)), torch.randint(0, 64, (batch_size, 32))


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output
