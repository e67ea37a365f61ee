"""Models named as MODULE:NAME (``tests.factories:build_mlp``) instead of by a model file."""

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            *(nn.Sequential(nn.Linear(32, 32), nn.Tanh()) for _ in range(8))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def build_mlp() -> nn.Module:
    """A factory: the model; its batch is this module's ``example_inputs``."""
    return MLP()


def example_inputs(batch_size: int = 512) -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch_size, 32),)


def build_list() -> list[int]:
    return [1]


def broken() -> nn.Module:
    raise ValueError("no such width")


class Wide:
    """An object with a model file's functions of its own."""

    @staticmethod
    def build_model() -> nn.Module:
        return nn.Sequential(*(nn.Sequential(nn.Linear(8, 64), nn.Linear(64, 8)) for _ in range(3)))

    @staticmethod
    def example_inputs(batch_size: int = 2) -> dict[str, torch.Tensor]:
        return {"input": torch.randn(batch_size, 8)}


WIDTH = 32
