"""Hub-kernel layers inside a region, resolved so that ``torch.compile`` traces them cleanly.

The ``kernels`` package that transformers installs routes a model's calls of a hub function
(Llama's ``apply_rotary_pos_emb``) to the model's own copy by wrapping the calling layer's
``forward`` (``use_kernelized_func``): the wrapper sets a module-global routing table before
the original ``forward`` and resets it after. Under ``torch.compile`` that set and reset are
attribute writes on a global object, which dynamo refuses inside a checkpoint's higher-order
op ("Mutating a variable from outside the scope of this HOP"): every region holding such a
layer broke the graph, and a break in the decoder's layer loop sent the whole loop to eager.

Compiled, the routing only matters where the model's copy was kernelized (its ``forward``
replaced by ``kernels.kernelize``); otherwise the hub function runs its own code either way.
So a layer of a region whose copies are all unkernelized runs its original ``forward`` while
compiling, with nothing written; eager calls, and kernelized layers, keep the wrapper.
"""

from __future__ import annotations

from typing import Any

import torch

from ckptplan.huggingface import hub_kernelized, routes_hub_functions


class HubForward:
    """A hub-routing layer's ``forward``: the wrapped original while compiling, when routing
    would change nothing (Note above), else the wrapper. Kept in the layer's ``__dict__``."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module
        wrapper = type(module).forward
        if torch.compiler.is_compiling() and not hub_kernelized(module):
            return wrapper.__wrapped__(module, *args, **kwargs)  # type: ignore[attr-defined]
        return wrapper(module, *args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return HubForward, (self.module,)


def resolve_hub_layers(members: list[torch.nn.Module]) -> None:
    """Give each hub-routing layer in ``members`` (themselves included) a ``HubForward``."""
    for member in members:
        for module in member.modules():
            if routes_hub_functions(module) and "forward" not in module.__dict__:
                module.__dict__["forward"] = HubForward(module)
