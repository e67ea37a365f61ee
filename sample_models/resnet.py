"""A ResNet-18 style CNN (CIFAR layout, narrow) on 64x64 images.

A 3x3 stem, then 8 residual basic blocks (conv-BN-ReLU-conv-BN + shortcut, ReLU) in four
stages of 32, 64, 128 and 256 channels; the first block of each later stage downsamples
with stride 2 and a 1x1 projection shortcut. Global average pooling and a linear classifier;
the forward returns the cross-entropy loss against the given labels.

Why it is in the suite: the blocks are one class but not one cost. Early blocks work at high
resolution with few channels (many activation bytes, few FLOPs), late blocks the opposite,
so a good plan checkpoints unevenly. BatchNorm updates its running statistics in forward,
so recomputing a block must not count a batch twice.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

NUM_CLASSES = 100
IMAGE_SIZE = 64
WIDTHS = (32, 64, 128, 256)
BLOCKS_PER_STAGE = (2, 2, 2, 2)


class BasicBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.act2 = nn.ReLU()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_ch),
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.act2(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(
        self,
        widths: tuple = WIDTHS,
        blocks_per_stage: tuple = BLOCKS_PER_STAGE,
        num_classes: int = NUM_CLASSES,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, padding=1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(),
        )
        blocks = []
        in_ch = widths[0]
        for stage, (width, n) in enumerate(zip(widths, blocks_per_stage, strict=True)):
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(in_ch, width, stride))
                in_ch = width
        self.blocks = nn.ModuleList(blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.stem(images)
        for block in self.blocks:
            x = block(x)
        logits = self.fc(torch.flatten(self.pool(x), 1))
        return F.cross_entropy(logits, labels)


def build_model() -> nn.Module:
    return ResNet()


def example_inputs(batch_size: int = 32) -> tuple:
    images = torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE)
    labels = torch.randint(0, NUM_CLASSES, (batch_size,))
    return (images, labels)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output
