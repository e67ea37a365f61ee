"""Module hooks per unit when a unit is one call of a module (``ckptplan.values.unit_names``).

A module that runs several times in one forward is several units, one per call; hooks
registered per unit would each fire at every call. Here each module gets one pre-hook and one
hook, and each call goes to the hooks of the unit that is that call (calls no unit names go
unwatched).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from ckptplan.values.unit_names import split_unit

Hook = Callable[..., Any]


def unit_hooks(
    units: list[tuple[str, torch.nn.Module]],
    pre: Callable[[int], Hook],
    post: Callable[[int], Hook],
    with_kwargs: bool = False,
) -> Iterator[RemovableHandle]:
    """Register ``pre(index)`` and ``post(index)`` as the forward pre-hook and hook of unit
    ``index``'s call of its module; yields the handles. Calls are counted from the first
    forward after registering."""
    modules: dict[int, tuple[torch.nn.Module, dict[int | None, int]]] = {}
    for index, (name, module) in enumerate(units):
        _, call = split_unit(name)
        modules.setdefault(id(module), (module, {}))[1][call] = index
    for module, indices in modules.values():
        if None in indices:
            hooks = (pre(indices[None]), post(indices[None]))
        else:
            hooks = _by_call(
                {c: pre(i) for c, i in indices.items() if c is not None},
                {c: post(i) for c, i in indices.items() if c is not None},
            )
        yield module.register_forward_pre_hook(hooks[0], with_kwargs=with_kwargs)
        yield module.register_forward_hook(hooks[1], with_kwargs=with_kwargs)


def _by_call(pres: dict[int, Hook], posts: dict[int, Hook]) -> tuple[Hook, Hook]:
    """A pre-hook and a hook that pass each call on to the hooks of its index."""
    made = 0
    running: list[int] = []

    def pre_hook(*args: Any) -> Any:
        nonlocal made
        running.append(made)
        made += 1
        hook = pres.get(running[-1])
        return None if hook is None else hook(*args)

    def post_hook(*args: Any) -> Any:
        hook = posts.get(running.pop())
        return None if hook is None else hook(*args)

    return pre_hook, post_hook
