"""A Vision Transformer (ViT-Tiny width) on 256x256 images with 16x16 patches.

A strided-conv patch embedding (256 patches + a class token = 257 tokens), learned position
embeddings, 12 pre-LN encoder blocks (multi-head self-attention + GELU MLP, residual adds),
a final LayerNorm and a linear classifier on the class token. The forward takes keyword
inputs ``images`` and ``labels`` and returns the cross-entropy loss.

Why it is in the suite: high resolution means many tokens, and the attention is written out
explicitly (softmax of q @ k^T), so each block keeps its (heads x tokens x tokens) score
matrix for backward: per block, activation bytes grow quadratically with the token count
while the weights stay small. Inputs are passed as a dict of keyword arguments.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

IMAGE_SIZE = 256
PATCH_SIZE = 16
NUM_CLASSES = 100
DEPTH = 12
EMBED_DIM = 192
NUM_HEADS = 3
MLP_RATIO = 4


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        assert dim % num_heads == 0
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).view(B, N, 3, self.num_heads, C // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, N, head_dim)
        att = (q @ k.transpose(-2, -1)) * self.scale
        att = att.softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(y)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, mlp_ratio * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return x


class ViT(nn.Module):
    def __init__(
        self,
        image_size: int = IMAGE_SIZE,
        patch_size: int = PATCH_SIZE,
        num_classes: int = NUM_CLASSES,
        depth: int = DEPTH,
        embed_dim: int = EMBED_DIM,
        num_heads: int = NUM_HEADS,
        mlp_ratio: int = MLP_RATIO,
    ) -> None:
        super().__init__()
        num_patches = (image_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(3, embed_dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, embed_dim))
        self.blocks = nn.ModuleList([Block(embed_dim, num_heads, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes)

        # timm uses trunc_normal_(std=0.02) with bounds +-2, which is plain normal_ at this std;
        # normal_ also never reads values, so the model builds under FakeTensorMode.
        nn.init.normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, num_patches, dim)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x)[:, 0])
        return F.cross_entropy(logits, labels)


def build_model() -> nn.Module:
    return ViT()


def example_inputs(batch_size: int = 8) -> dict:
    return {
        "images": torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE),
        "labels": torch.randint(0, NUM_CLASSES, (batch_size,)),
    }


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output
