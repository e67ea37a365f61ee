"""``ckptplan.apply``: checkpoint a model as a solved plan says, or as the plan solved (and
cached, ``ckptplan.plancache``) for a budget and an example batch.

A training job imports this to apply a plan file: it loads only the runtime (``applying/``, the
plan's types, the fingerprint), never the planner, whose private-torch use would then be a risk
to training. Solving imports the planner here, only when a budget is given.

Example:
    >>> model = ckptplan.apply(model, "plan.json")  # doctest: +SKIP
    >>> model = ckptplan.apply(model, budget="60%", example_inputs=batch)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ckptplan.applying.install import apply as apply_plan
from ckptplan.errors import CkptplanError
from ckptplan.plan import Plan

if TYPE_CHECKING:
    from ckptplan.loading import Inputs

_USAGE = (
    "ckptplan.apply(model, plan) applies a solved plan; "
    "ckptplan.apply(model, budget='12GB', example_inputs=batch) solves one"
)


def apply(
    model: torch.nn.Module,
    plan: Plan | str | Path | None = None,
    force: bool = False,
    *,
    budget: str | int | float | None = None,
    example_inputs: Inputs | torch.Tensor | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    cache_dir: str | Path | None = None,
    stage: int | None = None,
    **options: Any,
) -> torch.nn.Module:
    """Checkpoint ``model`` in place and return it: as ``plan`` says, or with ``budget`` and
    ``example_inputs`` (the args or kwargs of one training batch's forward) as the plan that
    ``ckptplan.solve`` finds for them, read from ``cache_dir`` when solved before.

    ``options`` are ``ckptplan.solve``'s (``dtype``, ``optimizer``, ``solver``,
    ``world_size``, ...). See ``ckptplan.applying.install.apply`` for what applying checks and does;
    ``stage`` applies one pipeline stage's section of the plan to that stage's module.
    """
    planning = {"budget": budget, "example_inputs": example_inputs, "loss_fn": loss_fn}
    planning.update(cache_dir=cache_dir, **options)
    if plan is not None:
        given = [name for name, value in planning.items() if value is not None]
        if given:
            raise CkptplanError(
                f"ckptplan.apply got a plan and {given[0]}=, which is for solving one; pass "
                f"one of them: {_USAGE}"
            )
        return apply_plan(model, plan, force, stage)
    if stage is not None:
        raise CkptplanError(
            "stage= applies one section of a pipeline plan; pass the plan (from "
            "ckptplan.solve_pipeline or solve --pipeline-stages) with it"
        )
    if budget is None:
        raise CkptplanError(f"ckptplan.apply needs a plan or budget=: {_USAGE}")
    from ckptplan.plancache import cached_plan  # the planner: loaded only to solve

    the_plan = cached_plan(
        model, budget, example_inputs, loss_fn=loss_fn, cache_dir=cache_dir, **options
    )
    return apply_plan(model, the_plan, force)
