"""ResNet-50 image classifier (torchvision, torchvision.models.resnet50).

torchvision's own constructor with its defaults (bottleneck blocks 3-4-6-3, BatchNorm,
zero-init off, no weights). Non-default: sizes only (10 classes, 64x64 images).

torchvision's PyPI wheel is built against CUDA torch: beside the CPU build of torch its
C++ ops (_C.so) do not load and `import torchvision` fails with "operator torchvision::nms
does not exist". `_import_torchvision` then declares the two op schemas that torchvision's
Python side registers fake kernels for, and imports again; the models need none of its ops.
With a torchvision that matches the torch build, the first import succeeds and nothing else
happens. Such a broken torchvision also breaks transformers (which imports it when installed),
so keep it out of an environment used for the Hugging Face models.
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
from torchvision.models import resnet50  # noqa: E402

IMAGE_SIZE = 64
NUM_CLASSES = 10


def build_model() -> torch.nn.Module:
    return resnet50(weights=None, num_classes=NUM_CLASSES)


def example_inputs(batch_size: int = 16) -> tuple:
    return (torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE),)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    target = torch.zeros(output.shape[0], dtype=torch.long, device=output.device)
    return F.cross_entropy(output, target)
