"""One pipeline stage's part of a plan, as ``apply(stage_module, plan, stage=i)`` applies
it: the stage's regions, once the module is checked to hold the stage's blocks."""

from __future__ import annotations

from dataclasses import replace

import torch

from ckptplan.errors import CkptplanError, option
from ckptplan.values.pipeline_types import parameters_digest
from ckptplan.values.plan import Plan


def stage_plan(model: torch.nn.Module, plan: Plan, stage: int, force: bool = False) -> Plan:
    """The plan of one stage for ``apply(stage_module, plan, stage=i)``: refuses, in one line,
    a plan without stages, a stage out of range, and a module that lacks the stage's blocks or
    holds other parameters under them (unless ``force``)."""
    if not plan.stages:
        raise CkptplanError(
            f"{option('stage', stage)}: the plan has no pipeline stages; solve it with "
            "--pipeline-stages P --microbatches M, or apply it without stage"
        )
    if not 0 <= stage < len(plan.stages):
        raise CkptplanError(
            f"{option('stage', stage)} is out of range: the plan has stages 0.."
            f"{len(plan.stages) - 1}"
        )
    section = plan.stages[stage]
    names = dict(model.named_modules())
    missing = [b for b in section.blocks if b not in names]
    if missing:
        raise CkptplanError(
            f"the stage module lacks {missing[0]}, a block of stage {stage} "
            f"({section.blocks[0]}..{section.blocks[-1]}); build stage {stage}'s module, "
            "keeping the blocks' qualified names"
        )
    modules = [
        (p, type(m).__name__, sum(q.numel() for q in m.parameters())) for p, m in names.items()
    ]
    if parameters_digest(modules, section.blocks) != section.parameters and not force:
        raise CkptplanError(
            f"stage {stage}'s blocks here differ from the plan's "
            f"({section.parameters['parameters']:,} parameters); re-solve for this model or "
            f"pass {option('force', True)}"
        )
    # A later stage's input is the previous stage's activations, which the plan does not
    # record: the batch guard watches the first stage alone.
    predicted = replace(
        plan.predicted, peak_bytes=section.predicted_peak_bytes, in_flight=section.in_flight
    )
    return replace(
        plan,
        regions=section.regions,
        stages=(),
        inputs=plan.inputs if stage == 0 else None,
        predicted=predicted,
    )
