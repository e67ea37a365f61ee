"""DeepLabV3 semantic segmentation (torchvision, deeplabv3_resnet50).

torchvision's own constructor with its defaults (dilated ResNet-50 backbone with output
stride 8, ASPP head, bilinear upsampling to the input size, no auxiliary head, no weights).
Non-default: sizes only (5 classes, 64x64 images). The loss is per-pixel cross-entropy of
output["out"] against an all-zero mask.

See tv_resnet50.py for why torchvision is imported through `_import_torchvision`.
"""

import torch
import torch.nn.functional as F


def _import_torchvision():
    try:
        import torchvision
    except RuntimeError as e:
        if "torchvision::nms" not in str(e):
            raise
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for op in ("nms", "qnms"):
            lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        torch._torchvision_schema_stub = lib  # keep the definitions alive
        import torchvision
    return torchvision


_import_torchvision()
from torchvision.models.segmentation import deeplabv3_resnet50  # noqa: E402

IMAGE_SIZE = 64
NUM_CLASSES = 5


def build_model() -> torch.nn.Module:
    return deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=NUM_CLASSES)


def example_inputs(batch_size: int = 2) -> tuple:
    return (torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE),)


def loss_fn(output) -> torch.Tensor:
    logits = output["out"]
    target = torch.zeros(logits.shape[0], *logits.shape[2:], dtype=torch.long, device=logits.device)
    return F.cross_entropy(logits, target)
