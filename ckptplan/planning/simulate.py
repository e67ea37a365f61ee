"""Predict a plan's training step: its peak (by category), recompute and step time.

The peak comes from the chain model the solvers optimise (``ckptplan.solvers.chain``); this
module adds what a person wants to read: which event peaks and what the bytes there are.
"""

from __future__ import annotations

from ckptplan.solvers.chain import Chain, Schedule
from ckptplan.values.peak_event import EventKind, PeakEvent
from ckptplan.values.prediction import Prediction
from ckptplan.values.profile_types import Profile


def _gradients_at(profile: Profile, event: PeakEvent) -> int:
    """Gradient bytes present at an event (an upper bound inside a block's backward)."""
    if event.kind in (EventKind.OPTIMIZER, EventKind.BACKWARD_BEFORE):
        return profile.gradient_bytes
    for block in profile.blocks:
        if event.module != block.path:
            continue
        if event.kind in (EventKind.BACKWARD, EventKind.RECOMPUTE):
            return block.grads_at_bwd_end
        if event.kind is EventKind.BACKWARD_BETWEEN and block.gap is not None:
            return block.gap.bwd_grads
    if event.kind is EventKind.BACKWARD_AFTER:
        return profile.blocks[-1].grads_at_bwd_end - profile.blocks[-1].gradient_bytes
    return 0


def predict(
    profile: Profile, chain: Chain, schedule: Schedule, scope: str = "step", offloaded: int = 0
) -> Prediction:
    """The prediction of ``schedule``; in scope ``activations`` the peak counts activations.

    ``offloaded`` is the host memory its selective policies offload to.
    """
    gradients = _gradients_at(profile, PeakEvent.parse(schedule.peak_event))
    persistent = profile.persistent_bytes
    activations = schedule.peak - (persistent + gradients if scope == "step" else 0)
    return Prediction(
        peak_bytes=schedule.peak,
        peak_event=schedule.peak_event,
        parameters=profile.parameter_bytes,
        gradients=gradients,
        optimizer=profile.optimizer_bytes,
        inputs=profile.input_bytes,
        activations=max(0, activations),
        recompute_time_s=schedule.recompute_time,
        step_time_s=profile.step_time,
        offloaded_bytes=offloaded,
    )
