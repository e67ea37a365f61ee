"""SimCLR-style contrastive training: one backbone run on two augmented views of a batch.

A small ResNet-like backbone (a 3x3 stem convolution, four residual blocks of two 3x3
convolutions with BatchNorm and ReLU, global average pooling) and SimCLR's two-layer
projection head, both run once per view in one forward; the loss is NT-Xent (temperature 0.5)
over the 2N projections, each view's positive being the other view of its image. Plain
PyTorch (SimCLR has no library of its own), PyTorch's defaults throughout (initialisation,
BatchNorm momentum). Sizes: width 32, projection 128, 16 images of 16px per view, 80K
parameters. Each block runs twice per step, once per view: each call is a unit of its own
(``ckptplan.values.unit_names``). The views are drawn in ``example_inputs`` (a flip and a brightness
jitter, a shifted crop and noise), so the step itself draws no random numbers.
"""

import torch
import torch.nn.functional as F
from torch import nn

WIDTH = 32
SIZE = 16
TEMPERATURE = 0.5


class Block(nn.Module):
    """A basic residual block: two 3x3 convolutions with BatchNorm, ReLU after the sum."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


class SimCLR(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, WIDTH, 3, padding=1, bias=False), nn.BatchNorm2d(WIDTH), nn.ReLU()
        )
        self.blocks = nn.Sequential(*(Block(WIDTH) for _ in range(4)))
        self.head = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 128))

    def embed(self, view: torch.Tensor) -> torch.Tensor:
        features = self.blocks(self.stem(view)).mean(dim=(2, 3))
        return self.head(features)

    def forward(self, view1: torch.Tensor, view2: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.embed(view1), self.embed(view2)


def build_model() -> nn.Module:
    return SimCLR()


def example_inputs(batch_size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.rand(batch_size, 3, SIZE, SIZE)
    brightness = 0.8 + 0.4 * torch.rand(batch_size, 1, 1, 1)
    view1 = (images.flip(-1) * brightness).clamp(0, 1)
    view2 = images.roll(shifts=(2, -3), dims=(2, 3)) + 0.05 * torch.randn_like(images)
    return view1, view2


def loss_fn(output: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """NT-Xent: each projection's cross-entropy over the 2N - 1 others, the positive being the
    other view of its image."""
    z = F.normalize(torch.cat(output), dim=1)
    n = output[0].shape[0]
    similarity = (z @ z.T) / TEMPERATURE
    similarity = similarity.masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
    positives = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
    return F.cross_entropy(similarity, positives)
