"""Apply a plan to a model in place, with non-reentrant ``torch.utils.checkpoint``.

A region of one module replaces that module's ``forward`` with a checkpointed call. A region
of several consecutive sibling blocks runs them all inside one checkpoint from the first
block's call; the later blocks then hand back the result already computed. That is exact when
each block receives the previous block's output and the same other arguments, which the
profiler checked before the solver was allowed to join them, and which is checked again at run
time. Module paths, ``state_dict`` keys and parameters are unchanged, so optimizers, saved
checkpoints and FSDP/DDP wrapping see the same model.

Example:
    >>> model = ckptplan.apply(model, "plan.json")   # doctest: +SKIP
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils.checkpoint import checkpoint

from ckptplan.errors import CkptplanError
from ckptplan.fingerprint import model_fingerprint
from ckptplan.plan import Plan, as_plan

log = logging.getLogger("ckptplan")


@dataclass(frozen=True)
class AppliedPlan:
    """What ``apply`` did: the regions it wrapped, by module paths."""

    regions: tuple[tuple[str, ...], ...]
    solver: str

    def __str__(self) -> str:
        names = ", ".join("+".join(r) if len(r) > 1 else r[0] for r in self.regions)
        return f"ckptplan: checkpointed {len(self.regions)} regions ({self.solver}): {names}"


class _Segment:
    """Runs a region's modules as one checkpoint and hands later members the result."""

    def __init__(self, modules: list[torch.nn.Module], paths: tuple[str, ...]) -> None:
        self.modules = modules
        self.paths = paths
        self.forwards = [m.forward for m in modules]
        self.pending: list[Any] = []

    def run(self, *args: Any, **kwargs: Any) -> Any:
        out = self.forwards[0](*args, **kwargs)
        for forward in self.forwards[1:]:
            out = forward(*_replace_first(args, kwargs, _first_tensor(out)), **kwargs)
        return out

    def call_first(self, *args: Any, **kwargs: Any) -> Any:
        out = checkpoint(self.run, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)
        if len(self.modules) > 1:
            self.pending = [out] * (len(self.modules) - 1)
        return out

    def call_later(self, index: int, *args: Any, **kwargs: Any) -> Any:
        if not self.pending:
            raise RuntimeError(
                f"ckptplan: {self.paths[index]} ran without {self.paths[0]} before it, but the "
                "plan checkpoints them as one region; re-solve with --max-segment 1"
            )
        out = self.pending.pop()
        x = _first_tensor(args) if args else _first_tensor(kwargs)
        if x is not _first_tensor(out):
            raise RuntimeError(
                f"ckptplan: {self.paths[index]} did not receive the output of the block before "
                "it, so it cannot share a checkpoint region; re-solve with --max-segment 1"
            )
        return out


class _Forward:
    """The ``forward`` installed on a planned module (an object, so ``deepcopy`` remaps it)."""

    def __init__(self, segment: _Segment, index: int) -> None:
        self.segment = segment
        self.index = index

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.index == 0:
            return self.segment.call_first(*args, **kwargs)
        return self.segment.call_later(self.index, *args, **kwargs)


def _first_tensor(tree: Any) -> torch.Tensor | None:
    for leaf in pytree.tree_leaves(tree):
        if isinstance(leaf, torch.Tensor):
            return leaf
    return None


def _replace_first(args: tuple[Any, ...], kwargs: dict[str, Any], x: Any) -> tuple[Any, ...]:
    """The next block's positional arguments: the previous output in place of the input."""
    if args:
        return (x, *args[1:])
    first = next(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
    kwargs[first] = x
    return ()


def apply(model: torch.nn.Module, plan: Plan | str | Path, force: bool = False) -> torch.nn.Module:
    """Checkpoint ``model`` in place as ``plan`` says, and return it.

    Refuses a model that is already checkpointed by ckptplan, and a model whose structure
    differs from the one the plan was made for (unless ``force``). The summary of what was
    wrapped is logged and kept as ``model.ckptplan_applied``.
    """
    plan = as_plan(plan)
    if getattr(model, "ckptplan_applied", None) is not None:
        raise CkptplanError(
            f"{type(model).__name__} is already checkpointed by ckptplan; apply a plan once"
        )
    fingerprint = model_fingerprint(model)
    if fingerprint["hash"] != plan.fingerprint["hash"] and not force:
        raise CkptplanError(
            f"the plan was made for another model ({plan.model}: {plan.fingerprint['class']}, "
            f"{plan.fingerprint['parameters']:,} parameters; this is {fingerprint['class']}, "
            f"{fingerprint['parameters']:,}); re-solve for this model or pass force=True"
        )
    modules = dict(model.named_modules())
    for region in plan.regions:
        for path in region.modules:
            if path not in modules:
                raise CkptplanError(f"the plan names module {path!r}, which this model lacks")
            if isinstance(modules[path].__dict__.get("forward"), _Forward):
                raise CkptplanError(f"{path} is already checkpointed by ckptplan")
    for region in plan.regions:
        members = [modules[p] for p in region.modules]
        segment = _Segment(members, region.modules)
        for index, module in enumerate(members):
            module.forward = _Forward(segment, index)
    applied = AppliedPlan(tuple(r.modules for r in plan.regions), plan.solver)
    model.ckptplan_applied = applied
    log.info("%s", applied)
    return model
