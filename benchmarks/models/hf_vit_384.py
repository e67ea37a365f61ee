"""Hugging Face ``ViTForImageClassification`` as a new user builds it: 12 layers, width 192,
3 heads (ViT-Tiny's shape), 384x384 images in 16x16 patches (577 tokens with the class token),
the library's defaults otherwise (its dropout probabilities are 0).

Built from a config, so nothing is downloaded. The inputs are ``pixel_values`` and class
``labels``, so the forward returns the loss.
"""

import torch
from transformers import ViTConfig, ViTForImageClassification

IMAGE_SIZE = 384
NUM_LABELS = 10


def build_model() -> torch.nn.Module:
    config = ViTConfig(
        image_size=IMAGE_SIZE,
        patch_size=16,
        hidden_size=192,
        num_hidden_layers=12,
        num_attention_heads=3,
        intermediate_size=768,
        num_labels=NUM_LABELS,
    )
    return ViTForImageClassification(config)


def example_inputs(batch_size: int = 2) -> dict[str, torch.Tensor]:
    return {
        "pixel_values": torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE),
        "labels": torch.randint(0, NUM_LABELS, (batch_size,)),
    }
