"""A U-Net (4 downsamplings) with long, concatenated skip connections; MSE loss vs a target.

Five encoder levels (two 3x3 conv-BN-ReLU each; every level after the first max-pools by 2
and doubles the channels) and four decoder levels (2x2 transposed-conv upsampling, then
concatenation with the encoder output of the same resolution and two conv-BN-ReLU). A 1x1
conv maps back to the image channels; the forward returns the MSE against the target.

Why it is in the suite: it is not a chain. Every encoder level's output is kept alive by a
skip until the matching decoder level, so those bytes cannot be freed by checkpointing the
encoder blocks; only the activations inside each level can. The repeated-block list that the
tool should find is ``self.encoder`` (5 blocks, the largest list); ``self.decoder`` (4
blocks) takes two inputs per block. Most bytes live at the top, full-resolution levels.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

IN_CHANNELS = 3
IMAGE_SIZE = 128
BASE_WIDTH = 16
DEPTH = 4  # number of downsamplings


def double_conv(in_ch: int, out_ch: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_ch),
        nn.ReLU(),
        nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_ch),
        nn.ReLU(),
    )


class EncoderBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, downsample: bool) -> None:
        super().__init__()
        self.pool = nn.MaxPool2d(2) if downsample else nn.Identity()
        self.conv = double_conv(in_ch, out_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.pool(x))


class DecoderBlock(nn.Module):
    def __init__(self, in_ch: int, skip_ch: int, out_ch: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(in_ch, in_ch // 2, 2, stride=2)
        self.conv = double_conv(in_ch // 2 + skip_ch, out_ch)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([self.up(x), skip], dim=1))


class UNet(nn.Module):
    def __init__(
        self, in_channels: int = IN_CHANNELS, base_width: int = BASE_WIDTH, depth: int = DEPTH
    ) -> None:
        super().__init__()
        widths = [base_width * 2**i for i in range(depth + 1)]
        self.encoder = nn.ModuleList(
            [EncoderBlock(in_channels, widths[0], downsample=False)]
            + [EncoderBlock(widths[i - 1], widths[i], downsample=True) for i in range(1, depth + 1)]
        )
        self.decoder = nn.ModuleList(
            [DecoderBlock(widths[i + 1], widths[i], widths[i]) for i in reversed(range(depth))]
        )
        self.head = nn.Conv2d(widths[0], in_channels, 1)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.encoder:
            x = block(x)
            skips.append(x)
        skips.pop()  # the bottleneck output is x itself
        for block in self.decoder:
            x = block(x, skips.pop())
        return F.mse_loss(self.head(x), target)


def build_model() -> nn.Module:
    return UNet()


def example_inputs(batch_size: int = 8) -> tuple:
    x = torch.randn(batch_size, IN_CHANNELS, IMAGE_SIZE, IMAGE_SIZE)
    target = torch.randn(batch_size, IN_CHANNELS, IMAGE_SIZE, IMAGE_SIZE)
    return (x, target)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output
