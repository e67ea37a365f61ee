"""Turn what one instrumented step recorded into a ``Profile``: each block's figures, the code
between blocks (gaps), the events outside the blocks and the step's totals.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from ckptplan.devices import get_device
from ckptplan.errors import CkptplanError, option
from ckptplan.fingerprint import inputs_signature, model_fingerprint
from ckptplan.loading import Workload
from ckptplan.profiling.costs import OpRecorder
from ckptplan.profiling.memtrack import TrackedPhase, storage_bytes
from ckptplan.profiling.steprecorder import StepRecorder
from ckptplan.profiling.stepruns import Blocks
from ckptplan.values.peak_event import OUTSIDE_PHASES, PeakEvent
from ckptplan.values.phase import Direction, Phase
from ckptplan.values.profile_types import BlockProfile, Gap, Profile, Settings

_TAIL = (Phase.post(Direction.FORWARD), Phase.post(Direction.BACKWARD))
"""The phases between the last block's forward and its backward."""
_FIXED = (Phase.pre(Direction.FORWARD), Phase.pre(Direction.BACKWARD), Phase.optimizer())
"""The phases no plan changes."""


def assemble(
    model_file: Workload,
    model: torch.nn.Module,
    inputs: Any,
    settings: Settings,
    blocks: Blocks,
    recorder: StepRecorder,
    costs: OpRecorder,
    nograd: list[int],
    persistent_bytes: int,
    optimizer: torch.optim.Optimizer | None,
    policy_op_time: float,
) -> Profile:
    """The profile of the step ``recorder`` and ``costs`` watched over ``blocks``."""
    phases = {Phase.parse(p.label): p for p in recorder.tracker.phases}
    index_of = {Phase.parse(p.label): i for i, p in enumerate(recorder.tracker.phases)}
    for i, (path, _) in enumerate(blocks):
        calls = recorder.calls[i].calls
        if calls != 1:
            raise CkptplanError(
                f"block {path} runs {calls} times in one forward; a block must run once "
                f"per step: choose other blocks with {option('blocks')}"
            )
        if Phase.backward(i) not in phases:
            raise CkptplanError(
                f"the output of block {path} needs no gradient, so it cannot be checkpointed; "
                f"choose other blocks with {option('blocks')}"
            )
    base = persistent_bytes
    flops, seconds = costs.totals()
    random_phases = {r.phase for r in costs.records if r.random}
    profiles: list[BlockProfile] = []
    for i, (path, module) in enumerate(blocks):
        call = recorder.calls[i]
        forward = Phase.forward(i)
        label = forward.label
        saved_here = recorder.saved.get(forward, {})
        boundary = {call.input_key, call.output_key}
        saved_bytes = sum(
            size
            for key, (size, allocated) in saved_here.items()
            if allocated == index_of[forward] and key not in boundary
        )
        before = recorder.saved.get(Phase.forward(i - 1) if i else Phase.pre(Direction.FORWARD), {})
        input_kept = call.input_key in saved_here or call.input_key in before
        # A later block takes this block's input as an extra argument (a U-Net's skip): joined
        # to the block before, the segment would drop that input only at some events (after
        # the later block's forward, or after its backward where a checkpoint of it saves the
        # skip), which no per-segment saving can say; as a segment's first input, it is exact.
        held = recorder.extra_inputs.get(call.input_key, -1) > i
        # Alive when its gradient arrives and dead before the block's backward ends: what kept
        # it was the block's own saved tensors, which a checkpointed block does not hold.
        own_output = (
            call.output_key in saved_here and call.output_alive_at_bwd and call.output_died_in_bwd
        )
        # And kept by nothing else: no later code saves it or takes it again (a skip).
        freed = (
            own_output
            and not any(
                call.output_key in saved
                for phase, saved in recorder.saved.items()
                if phase != forward
            )
            and recorder.extra_inputs.get(call.output_key, -1) <= i
        )
        backward = Phase.backward(i)
        bwd_label = backward.label
        profiles.append(
            BlockProfile(
                path=path,
                class_name=type(module).__name__,
                input_bytes=call.input_bytes,
                output_bytes=call.output_bytes,
                saved_bytes=saved_bytes,
                input_kept=input_kept,
                joins_previous=call.joins_previous and not held,
                parameter_bytes=storage_bytes(module.parameters()),
                trainable_bytes=_trainable_bytes(module),
                fwd_start=base + phases[forward].start,
                fwd_peak=base + phases[forward].peak,
                fwd_peak_nograd=nograd[i],
                bwd_start=base + phases[backward].start,
                bwd_peak=base + phases[backward].peak,
                grads_at_bwd_end=recorder.grads_at_end.get(backward, 0),
                grads_at_bwd_start=phases[backward].gradients_at_start,
                grads_at_bwd_peak=_gradients_at_peak(phases[backward]),
                flops_fwd=flops[label],
                flops_bwd=flops[bwd_label],
                time_fwd=seconds[label],
                time_bwd=seconds[bwd_label],
                random=label in random_phases,
                stateful=_updates_buffers(module),
                own_output_bytes=call.output_bytes if own_output else 0,
                freed_output_bytes=call.output_bytes if freed else 0,
                gap=_gap_after(i, recorder, phases, base, seconds),
                replay_peak=base + recorder.replay_peaks.get(forward, phases[forward].start),
            )
        )
    tail = tuple((base + phases[p].peak, PeakEvent.outside(p).label) for p in _TAIL)
    fixed = tuple(
        (base + phases[p].peak, PeakEvent.outside(p).label) for p in _FIXED if p in phases
    )
    optimizer_state = [
        t
        for s in (optimizer.state.values() if optimizer else ())
        for t in s.values()
        if isinstance(t, torch.Tensor)
    ]
    return Profile(
        model_name=model_file.name,
        fingerprint=model_fingerprint(model),
        inputs=inputs_signature(inputs),
        settings=settings,
        blocks=tuple(profiles),
        parameter_bytes=storage_bytes(model.parameters()),
        trainable_bytes=_trainable_bytes(model),
        event_grads=tuple(
            (PeakEvent.outside(p).label, _gradients_at_peak(phases[p]))
            for p in OUTSIDE_PHASES
            if p in phases
        ),
        optimizer_bytes=storage_bytes(optimizer_state),
        input_bytes=storage_bytes(
            t for t in pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor)
        ),
        persistent_bytes=persistent_bytes,
        peak_bytes=base + recorder.tracker.peak,
        tail_peaks=tail,
        fixed_peaks=fixed,
        step_time=sum(seconds.values()),
        flops=sum(flops.values()),
        phases=tuple((p.label, base + p.start, base + p.peak) for p in recorder.tracker.phases),
        ops=tuple(costs.records),
        policy_op_time=policy_op_time,
        modules=tuple(
            (path, type(m).__name__, sum(p.numel() for p in m.parameters()))
            for path, m in model.named_modules()
        ),
        enclosures=recorder.enclosing.enclosures() if recorder.enclosing else (),
        region_state_bytes=(
            0 if get_device(settings.device).host_bandwidth else torch.get_rng_state().numel()
        ),
    )


def _gap_after(
    index: int,
    recorder: StepRecorder,
    phases: dict[Phase, TrackedPhase],
    base: int,
    seconds: dict[str, float],
) -> Gap | None:
    """The code between block ``index`` and the next, when there is any."""
    following = index + 1
    if following >= len(recorder.calls) or not recorder.calls[following].gap_before:
        return None
    gap = Phase.gap(Direction.FORWARD, index)
    forward = phases[gap]
    backward = phases.get(Phase.gap(Direction.BACKWARD, index))
    index_of = {Phase.parse(p.label): i for i, p in enumerate(recorder.tracker.phases)}
    boundary = {recorder.calls[index].output_key, recorder.calls[following].input_key}
    return Gap(
        fwd_peak=base + forward.peak,
        bwd_peak=None if backward is None else base + backward.peak,
        bwd_grads=0 if backward is None else _gradients_at_peak(backward),
        fwd_start=base + forward.start,
        bwd_start=None if backward is None else base + backward.start,
        bwd_start_grads=0 if backward is None else backward.gradients_at_start,
        saved_bytes=sum(
            size
            for key, (size, allocated) in recorder.saved.get(gap, {}).items()
            if allocated == index_of[gap] and key not in boundary
        ),
        fwd_time=seconds.get(gap.label, 0.0),
    )


def _gradients_at_peak(phase: TrackedPhase) -> int:
    """What an activations budget takes off the phase's peak: the gradients alive when the
    activations peak (not those made later in the phase, nor those freed before)."""
    return phase.peak - phase.activation_peak


def _trainable_bytes(module: torch.nn.Module) -> int:
    return storage_bytes(p for p in module.parameters() if p.requires_grad)


def _updates_buffers(module: torch.nn.Module) -> bool:
    return any(
        isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats
        for m in module.modules()
    )
