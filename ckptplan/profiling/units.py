"""The checkpointable units of a model: the module calls its chain is made of.

A unit is one module call that torch's checkpoint can wrap: called once per step, with an
output that needs a gradient. The default units are the repeated blocks of *every* stage of the
module tree, in the order the step runs them, not only the children of its largest
``ModuleList``:

- a ``ModuleList``/``Sequential`` whose children with weights repeat a class offers its
  children as units: transformer layers, ResNet bottlenecks, both towers of CLIP, the encoder
  and the decoder of T5;
- a unit that itself holds repeated blocks that feed one another (a ConvNeXt or Swin stage's
  blocks, the resnets and attentions of a UNet down block) is replaced by those blocks, so no
  unit is a whole stage when its blocks can be checkpointed one by one. Single layers (the
  convolutions inside a block) never replace their block, and blocks that do not feed one
  another (the experts of a mixture-of-experts layer, parallel branches) stay inside it;
- a block with weights that runs several times in one forward (ALBERT's one layer group run
  once per layer, a backbone run on two views) is one unit per call
  (``ckptplan.values.unit_names``), unless its own repeated blocks give units: then each of
  their calls is one.

Which modules run, how often and in what order is read off one real (or fake) forward, so the
order is the execution order, not the order of definition (CLIP runs its vision tower first).

Example:
    >>> import torch.nn as nn
    >>> class Stage(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.down = nn.Linear(4, 4)
    ...         self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4)) for _ in range(2)])
    ...     def forward(self, x):
    ...         return self.blocks(self.down(x))
    >>> model = nn.Sequential(Stage(), Stage())
    >>> x = torch.randn(2, 4, requires_grad=True)
    >>> [path for path, _ in find_units(model, lambda: model(x))]
    ['0.blocks.0', '0.blocks.1', '1.blocks.0', '1.blocks.1']
"""

from __future__ import annotations

import fnmatch
import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ckptplan.applying.layered_rnn import RecurrentLayer
from ckptplan.errors import CkptplanError, option
from ckptplan.profiling.rnn import stacked_layers_advice
from ckptplan.values.unit_names import split_unit, unit_name

_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential)
_UNCALLED = (torch.nn.ModuleList, torch.nn.ModuleDict)  # hold modules, never called


@dataclass
class _Call:
    """What one step showed of a module: its first call, how often, what it read and made."""

    order: int
    count: int = 1
    input_id: int | None = None
    output_id: int | None = None
    orders: list[int] = field(default_factory=list)
    """Each call's place among the watched calls of the step."""
    grads: list[bool] = field(default_factory=list)
    """Whether each call's output needs a gradient."""
    forwards: set[int] = field(default_factory=set)
    """The model's forwards (counted in the step) its calls ran in."""


def _has_weights(module: torch.nn.Module) -> bool:
    """Holds weights, or computes with its stack's (a layer of a split LSTM)."""
    return isinstance(module, RecurrentLayer) or next(module.parameters(), None) is not None


def _is_stage(module: torch.nn.Module) -> bool:
    """A container whose children repeat a class of modules with weights."""
    if not isinstance(module, _CONTAINERS) or len(module) < 2:
        return False
    classes = Counter(type(child) for child in module if _has_weights(child))
    return bool(classes) and classes.most_common(1)[0][1] >= 2


def _first_tensor(tree: Any) -> torch.Tensor | None:
    return next((t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)), None)


@contextmanager
def _watched(
    root: torch.nn.Module, modules: dict[str, torch.nn.Module]
) -> Iterator[dict[str, _Call]]:
    """Record each module's calls while active. Tensors are compared by identity, so the
    first input and output of every call are held until the block exits."""
    calls: dict[str, _Call] = {}
    held: list[torch.Tensor] = []
    counts = Counter[str]()

    def forward(module: torch.nn.Module, args: Any) -> None:
        counts["forwards"] += 1

    handles = [root.register_forward_pre_hook(forward)]

    def pre(path: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            counts["calls"] += 1
            call = calls.get(path)
            if call is not None:
                call.count += 1
            else:
                x = _first_tensor(args) if args else _first_tensor(kwargs)
                call = calls[path] = _Call(order=counts["calls"])
                call.input_id = None if x is None else id(x)
                if x is not None:
                    held.append(x)
            call.orders.append(counts["calls"])
            call.forwards.add(counts["forwards"])

        return hook

    def post(path: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            call = calls[path]
            out = _first_tensor(output)
            call.grads.append(out is not None and out.requires_grad)
            if call.count == 1 and out is not None:
                call.output_id = id(out)
                held.append(out)

        return hook

    try:
        for path, module in modules.items():
            handles.append(module.register_forward_pre_hook(pre(path), with_kwargs=True))
            handles.append(module.register_forward_hook(post(path), with_kwargs=True))
        yield calls
    finally:
        for handle in handles:
            handle.remove()
        held.clear()


def find_units(
    model: torch.nn.Module, run_forward: Callable[[], Any], pattern: str | None = None
) -> list[tuple[str, torch.nn.Module]]:
    """The chain of units, in execution order: modules matching ``pattern`` (comma-separated
    globs over module paths), or by default the repeated blocks of every stage and the shared
    blocks. A module that runs several times is one unit per call (``ckptplan.values.unit_names``).

    ``run_forward`` runs the model's forward once (it may run a whole step).
    """
    modules = dict(model.named_modules())
    if pattern is not None:
        watched = _matching(modules, pattern)
    else:
        watched = {
            path: module
            for path, module in modules.items()
            if path and _has_weights(module) and not isinstance(module, _UNCALLED)
        }
        watched.update(
            (f"{path}.{name}" if path else name, child)
            for path, module in modules.items()
            if _is_stage(module)
            for name, child in module.named_children()
        )
    with _watched(model, watched) as calls:
        run_forward()
    if pattern is not None:
        ran = [path for path in watched if path in calls]
        if not ran:
            raise CkptplanError(
                f"{option('blocks', pattern)} matches modules the forward never calls"
            )
        return _unit_calls(ran, modules, calls)
    chosen = _select("", modules, calls)
    if not chosen:
        raise CkptplanError(
            f"{type(model).__name__} has no nn.ModuleList or nn.Sequential of repeated blocks "
            f"whose outputs need a gradient; name the blocks with {option('blocks')}"
            + _suggestion(modules, calls)
            + stacked_layers_advice(modules)
        )
    return _unit_calls(chosen, modules, calls)


def _unit_calls(
    paths: list[str], modules: dict[str, torch.nn.Module], calls: dict[str, _Call]
) -> list[tuple[str, torch.nn.Module]]:
    """The units of ``paths`` in execution order: a module's only call, or each call of a
    module that runs several times whose output needs a gradient."""
    units: list[tuple[int, str]] = []
    for path in paths:
        call = calls[path]
        if call.count == 1:
            units.append((call.order, path))
            continue
        if len(call.forwards) > 1:
            raise CkptplanError(
                f"{path} runs in {len(call.forwards)} forwards of the model in one step, but a "
                "plan counts the calls of a shared module within one forward: run them in one "
                f"forward, or choose other blocks with {option('blocks')}"
            )
        units += [
            (order, unit_name(path, k))
            for k, (order, grad) in enumerate(zip(call.orders, call.grads, strict=True))
            if grad
        ]
    return [(name, modules[split_unit(name)[0]]) for _, name in sorted(units)]


def _matching(modules: dict[str, torch.nn.Module], pattern: str) -> dict[str, torch.nn.Module]:
    patterns = [p.strip() for p in pattern.split(",") if p.strip()]
    found = [p for p in modules if p and any(fnmatch.fnmatchcase(p, g) for g in patterns)]
    outermost = [p for p in found if not any(p.startswith(other + ".") for other in found)]
    if not outermost:
        raise CkptplanError(
            f"{option('blocks', pattern)} matches no module; module paths look like "
            f"{example_paths_of(modules)}"
        )
    return {p: modules[p] for p in outermost}


def _select(path: str, modules: dict[str, torch.nn.Module], calls: dict[str, _Call]) -> list[str]:
    """The units inside the module at ``path`` (see the module docstring)."""
    module = modules[path]
    children = [f"{path}.{name}" if path else name for name, _ in module.named_children()]
    units: list[str] = []
    for child in children:
        inner = _select(child, modules, calls)
        if not _is_stage(module) or (_blocks(inner, modules) and _feed_one_another(inner, calls)):
            units += inner
        elif _checkpointable(child, modules, calls):
            units.append(child)
        else:
            units += inner
    if path and _shared(path, modules, calls) and not _blocks(units, modules):
        return [path]
    return units


def _blocks(units: list[str], modules: dict[str, torch.nn.Module]) -> bool:
    """Two units or more, none a single layer."""
    return len(units) >= 2 and all(next(modules[u].children(), None) is not None for u in units)


def _shared(path: str, modules: dict[str, torch.nn.Module], calls: dict[str, _Call]) -> bool:
    """A block (not a single layer) with weights that runs several times, some call's output
    needing a gradient: ALBERT's shared layer group, a backbone run on two views."""
    call = calls.get(path)
    module = modules[path]
    return (
        call is not None
        and call.count > 1
        and _checkpointable(path, modules, calls)
        and next(module.children(), None) is not None
    )


def _checkpointable(
    path: str, modules: dict[str, torch.nn.Module], calls: dict[str, _Call]
) -> bool:
    call = calls.get(path)
    return call is not None and any(call.grads) and _has_weights(modules[path])


def _feed_one_another(units: list[str], calls: dict[str, _Call]) -> bool:
    """Whether most units, in execution order, take their predecessor's output."""
    ordered = sorted(units, key=lambda p: calls[p].order)
    pairs = list(itertools.pairwise(ordered))
    linked = sum(
        calls[b].input_id is not None and calls[b].input_id == calls[a].output_id for a, b in pairs
    )
    return 2 * linked >= len(pairs)


def _suggestion(modules: dict[str, torch.nn.Module], calls: dict[str, _Call]) -> str:
    """Blocks to name that ``find_units`` accepts, as the rest of the error's sentence.

    The first module paths would be nested (one region) and the weights may lie deeper, so
    this walks down from the model while one child holds most of the weights and has blocks
    of its own, and names that module's children that can be units as they are: each called
    once, with weights and an output that needs a gradient (``_checkpointable``).
    """
    path = ""
    while True:
        heaviest = max(_children(path, modules), key=lambda c: _size(modules[c]), default=None)
        if heaviest is None or 2 * _size(modules[heaviest]) <= _size(modules[path]):
            break
        if len(_units_as_they_are(heaviest, modules, calls)) < 2:
            break
        path = heaviest
    units = _units_as_they_are(path, modules, calls)
    if not units:
        return "; no submodule here is called once with an output that needs a gradient"
    share = sum(_size(modules[u]) for u in units) / _size(modules[""])
    return (
        f", e.g. {option('blocks', ','.join(units))} (the children of {path or 'the model'} "
        f"that run once and hold weights: {share:.0%} of the model's parameters)"
    )


def _children(path: str, modules: dict[str, torch.nn.Module]) -> list[str]:
    return [f"{path}.{name}" if path else name for name, _ in modules[path].named_children()]


def _size(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _units_as_they_are(
    path: str, modules: dict[str, torch.nn.Module], calls: dict[str, _Call]
) -> list[str]:
    """The children of ``path`` that ``blocks=`` can name as units: checkpointable, one call."""
    return [
        child
        for child in _children(path, modules)
        if _checkpointable(child, modules, calls) and calls[child].count == 1
    ]


def example_paths_of(modules: dict[str, torch.nn.Module]) -> str:
    paths = [p for p in modules if p][:3]
    return ", ".join(paths) if paths else "(the model has no submodules)"
