"""What a training script calls: ``ckptplan.apply`` checkpoints a model as a solved plan says;
``ckptplan.autoplan`` solves the plan for a budget and an example batch (cached,
``ckptplan.plancache``) and applies it. (Not ``autoplan.py``: a module of a function's name
would shadow the function as an attribute of the package.)

A training job imports this to apply a plan file: it loads only the runtime (``applying/``, the
plan's types, the fingerprint), never the planner, whose private-torch use would then be a risk
to training. ``autoplan`` imports the planner when it is called, not before.

Example:
    >>> model = ckptplan.apply(model, "plan.json")  # doctest: +SKIP
    >>> model = ckptplan.autoplan(model, batch, budget="60%")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ckptplan.applying.install import apply as apply_plan
from ckptplan.deprecation import moved_to, old_spellings
from ckptplan.progress import QUIET, Progress
from ckptplan.values.plan import Plan

if TYPE_CHECKING:
    from ckptplan.loading import Inputs
    from ckptplan.options import Autocast, DType, Optimizer, Scope, Strategy, Target
    from ckptplan.solvers import SolverName


@old_spellings(device="target")
def autoplan(
    model: torch.nn.Module,
    example_inputs: Inputs | torch.Tensor | None,
    *,
    budget: str | int | float,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    cache_dir: str | Path | None = None,
    force: bool = False,
    solver: SolverName = "auto",
    scope: Scope = "step",
    margin: float | None = None,
    fake_run: bool = True,
    offload: bool = True,
    every: int = 2,
    max_segment: int | None = None,
    batch_size: int | None = None,
    optimizer: Optimizer | str | type[torch.optim.Optimizer] = "adamw",
    dtype: DType | torch.dtype = "fp32",
    autocast: Autocast | torch.dtype | None = None,
    target: Target = "cpu",
    blocks: str | None = None,
    measure: bool = False,
    compiled: bool = False,
    world_size: int = 1,
    strategy: Strategy | None = None,
    progress: Progress = QUIET,
) -> torch.nn.Module:
    """Checkpoint ``model`` in place, and return it, as the plan ``ckptplan.solve`` finds for
    ``budget`` and ``example_inputs`` (the args or kwargs of one training batch's forward),
    read from ``cache_dir`` when solved before (``ckptplan.plancache``).

    The options are ``ckptplan.solve``'s, with the same names and defaults; ``force`` is
    ``apply``'s. Solving runs on copies of the model on fake tensors and leaves the caller's
    random state, modes and weights as they were.
    """
    from ckptplan.options import options_from  # the planner: loaded only to solve
    from ckptplan.plancache import cached_plan

    step, search, ranks = options_from(locals())
    plan = cached_plan(
        model, budget, example_inputs, step, search, ranks, loss_fn, cache_dir, progress
    )
    return apply_plan(model, plan, force)


@moved_to(autoplan, "budget", "ckptplan.apply(model, budget=...)", "ckptplan.autoplan")
def apply(
    model: torch.nn.Module,
    plan: Plan | str | Path,
    force: bool = False,
    *,
    stage: int | None = None,
) -> torch.nn.Module:
    """Checkpoint ``model`` in place as ``plan`` (a ``Plan`` or its file) says, and return it.

    See ``ckptplan.applying.install.apply`` for what applying checks and does; ``force``
    applies a plan made for another model's fingerprint; ``stage`` applies one pipeline
    stage's section of the plan to that stage's module. To solve a plan and apply it in one
    call, ``ckptplan.autoplan`` (``apply(model, budget=...)`` is its old spelling).
    """
    return apply_plan(model, plan, force, stage)
