"""ConvNeXt-Atto image classifier (timm, timm.create_model("convnext_atto")).

timm's own registered variant with its defaults (depths 2-2-6-2, widths 40-80-160-320,
7x7 depthwise convs, LayerNorm2d, 1x1-conv MLP, layer scale, no drop path, no pretrained
weights). Non-default: sizes only (10 classes, 96x96 images).

timm imports torchvision; see tv_resnet50.py for why it goes through `_import_torchvision`.
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
import timm  # noqa: E402

IMAGE_SIZE = 96
NUM_CLASSES = 10


def build_model() -> torch.nn.Module:
    return timm.create_model("convnext_atto", pretrained=False, num_classes=NUM_CLASSES)


def example_inputs(batch_size: int = 32) -> tuple:
    return (torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE),)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    target = torch.zeros(output.shape[0], dtype=torch.long, device=output.device)
    return F.cross_entropy(output, target)
