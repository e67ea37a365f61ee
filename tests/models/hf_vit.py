"""A tiny Hugging Face ViT (``ViTForImageClassification``): 4 layers, width 64, dropout 0.1.

Built from a config, so nothing is downloaded. 64x64 images in 8x8 patches give 65 tokens
(with the class token); a batch of 32 images makes the activations outweigh the weights.
The inputs are ``pixel_values`` and class ``labels``, so the forward returns the loss.
"""

import torch
from transformers import ViTConfig, ViTForImageClassification

IMAGE_SIZE = 64
NUM_LABELS = 10


def build_model() -> torch.nn.Module:
    config = ViTConfig(
        image_size=IMAGE_SIZE,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=256,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        num_labels=NUM_LABELS,
    )
    return ViTForImageClassification(config)


def example_inputs(batch_size: int = 32) -> dict[str, torch.Tensor]:
    return {
        "pixel_values": torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE),
        "labels": torch.randint(0, NUM_LABELS, (batch_size,)),
    }
