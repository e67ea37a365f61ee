"""Vision Transformer image classifier (Hugging Face transformers, ViTForImageClassification).

Built from ViTConfig with the library's defaults (CLS token, learned positions, pre-LN,
GELU, no dropout). Non-default: sizes only (4 layers, hidden 256, 4 heads, MLP 1024,
64x64 images in 8x8 patches, 10 classes).
"""

import torch
from transformers import ViTConfig, ViTForImageClassification

IMAGE_SIZE = 64
NUM_CLASSES = 10


def build_model() -> torch.nn.Module:
    config = ViTConfig(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        image_size=IMAGE_SIZE,
        patch_size=8,
        num_labels=NUM_CLASSES,
    )
    return ViTForImageClassification(config)


def example_inputs(batch_size: int = 32) -> dict:
    pixel_values = torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE)
    labels = torch.randint(0, NUM_CLASSES, (batch_size,))
    return {"pixel_values": pixel_values, "labels": labels}
