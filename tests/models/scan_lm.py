"""A recurrent LM whose parameters each receive many gradients in one step.

Each block runs a linear recurrence over the sequence, reading its decay weight and a slice of
its input at every step (as the slow path of Mamba does): the autograd engine sums those
gradients in one buffer, in place on plain tensors. The embedding and the head share their
weight (two gradients for one parameter).
"""

import torch
from torch import nn


class Scan(nn.Module):
    """A weight read at every step of a loop over the sequence, as Mamba's slow path reads
    its decay: each step's gradient is summed into one buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 512)
        self.decay = nn.Parameter(torch.rand(512))
        self.proj = nn.Linear(512, 64)

    def forward(self, x):
        u = self.up(x)
        a = torch.sigmoid(self.decay)
        state = torch.zeros_like(u[:, 0])
        states = []
        for t in range(u.shape[1]):
            state = a * state + u[:, t]
            states.append(state)
        return self.proj(torch.stack(states, 1))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(128, 64)
        self.blocks = nn.ModuleList(Scan() for _ in range(3))
        self.head = nn.Linear(64, 128, bias=False)
        self.head.weight = self.embed.weight  # tied: two gradients for one weight

    def forward(self, ids):
        h = self.embed(ids)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def build_model():
    return Net()


def example_inputs(batch_size=16):
    return (torch.randint(0, 128, (batch_size, 32)),)


def loss_fn(logits):
    return logits.logsumexp(-1).mean()
