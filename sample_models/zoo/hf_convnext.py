"""ConvNeXt image classifier (Hugging Face transformers, ConvNextForImageClassification).

Built from ConvNextConfig with the library's defaults (4x4 patchify stem, 7x7 depthwise
convs, LayerNorm, inverted-bottleneck MLP, layer scale, depths 3-3-9-3). Non-default: sizes
only (stage widths 32-64-128-256, 64x64 images, 10 classes).
"""

import torch
from transformers import ConvNextConfig, ConvNextForImageClassification

IMAGE_SIZE = 64
NUM_CLASSES = 10


def build_model() -> torch.nn.Module:
    config = ConvNextConfig(
        hidden_sizes=[32, 64, 128, 256], image_size=IMAGE_SIZE, num_labels=NUM_CLASSES
    )
    return ConvNextForImageClassification(config)


def example_inputs(batch_size: int = 64) -> dict:
    pixel_values = torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE)
    labels = torch.randint(0, NUM_CLASSES, (batch_size,))
    return {"pixel_values": pixel_values, "labels": labels}
