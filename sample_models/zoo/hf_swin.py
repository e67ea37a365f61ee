"""Swin Transformer image classifier (Hugging Face transformers, SwinForImageClassification).

Built from SwinConfig with the library's defaults (4x4 patches, 7x7 shifted windows with
padding, patch merging between stages, depths 2-2-6-2, stochastic depth 0.1, GELU).
Non-default: sizes only (embedding dim 32, heads 1-2-4-8, 10 classes). Images stay at the
default 224x224 so every stage (56, 28, 14, 7) tiles into whole 7x7 windows.
"""

import torch
from transformers import SwinConfig, SwinForImageClassification

IMAGE_SIZE = 224
NUM_CLASSES = 10


def build_model() -> torch.nn.Module:
    config = SwinConfig(embed_dim=32, num_heads=[1, 2, 4, 8], num_labels=NUM_CLASSES)
    return SwinForImageClassification(config)


def example_inputs(batch_size: int = 4) -> dict:
    pixel_values = torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE)
    labels = torch.randint(0, NUM_CLASSES, (batch_size,))
    return {"pixel_values": pixel_values, "labels": labels}
