"""The scan for private torch names that ``tests/test_runtime_imports.py`` runs on the runtime."""

from __future__ import annotations

import pytest

from tests.private_torch import private_torch

pytestmark = [pytest.mark.torchfree, pytest.mark.runtime]


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("import torch\ntorch._C._current_graph_task_id()\n", ["line 2: torch._C"]),
        (
            "from torch.utils._python_dispatch import _disable_current_modes\n",
            ["line 1: torch.utils._python_dispatch._disable_current_modes"],
        ),
        (
            "from torch.overrides import _get_current_function_mode_stack as s\n",
            ["line 1: torch.overrides._get_current_function_mode_stack"],
        ),
        ("import torch._dynamo\n", ["line 1: torch._dynamo"]),
        ("import torch.nn as nn\nnn.modules._x\n", ["line 2: torch.nn.modules._x"]),
        (
            "from torch import autograd\nautograd.Variable._execution_engine.queue_callback\n",
            ["line 2: torch.autograd.Variable._execution_engine"],
        ),
        ("from torch.utils._pytree import tree_map_only\n", []),
        ("import torch\ntorch.utils._pytree.tree_map\n", []),
        ("import torch\ntorch.ops.aten._scaled_dot_product_flash_attention.default\n", []),
        ("import torch\ntorch.nn.Module.__call__\ntorch.compiler.is_compiling()\n", []),
        ("import numpy\nnumpy._core\nx._version\n", []),
    ],
)
def test_private_torch_names_are_found(source: str, found: list[str]) -> None:
    assert private_torch(source) == found
