"""The training steps the profiler runs on the model: a plain warm-up step, the instrumented
unchecked step (phases marked, storages tracked, ops recorded), and the ``no_grad`` forward that
gives each block's transient when it runs checkpointed.

``ckptplan.profiling.assembly`` turns what they record into a ``Profile``.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import torch

from ckptplan.applying.tensors import first_tensor
from ckptplan.devices import Device
from ckptplan.errors import CkptplanError
from ckptplan.loading import Workload, call_model
from ckptplan.profiling.costs import OpRecorder
from ckptplan.profiling.enclosures import EnclosureRecorder
from ckptplan.profiling.memtrack import LiveStorageTracker, gradients_counted, storage_bytes
from ckptplan.profiling.steprecorder import QuietModuleTracker, StepRecorder
from ckptplan.profiling.training import autocast_context, persistent_tensors
from ckptplan.profiling.workspace import Workspaces
from ckptplan.values.phase import Direction, Phase

Blocks = list[tuple[str, torch.nn.Module]]


def traced(
    model_file: Workload,
    model: torch.nn.Module,
    inputs: Any,
    optimizer: torch.optim.Optimizer | None,
    device: Device,
    autocast: str | None,
    blocks: Blocks,
) -> tuple[StepRecorder, OpRecorder, list[int], int]:
    """The instrumented step and the ``no_grad`` forward over ``blocks``, and the bytes that
    live across steps."""
    persistent = persistent_tensors(model, optimizer, inputs)
    ops = OpRecorder(device, QuietModuleTracker())
    recorder = instrumented_step(model_file, model, inputs, optimizer, blocks, ops, autocast)
    _every_block_ran(recorder)
    nograd = _nograd_transients(model, inputs, blocks, persistent, autocast, device)
    return recorder, ops, nograd, storage_bytes(persistent)


def _every_block_ran(recorder: StepRecorder) -> None:
    """Refuse a step that skipped a block the step before ran: the model skips blocks at
    random with a generator the profile cannot answer (``profiling.everyblock`` answers torch's
    scalar draws only), so no one step shows them all."""
    for (path, _), call in zip(recorder.blocks, recorder.calls, strict=True):
        if not call.calls:
            raise CkptplanError(
                f"{path} ran in one profiled step and not in the next: the model skips blocks "
                "at random with Python's or NumPy's generator; draw with torch.rand, or turn "
                "the skipping off while planning"
            )


def _tracker(persistent: list[torch.Tensor], device: Device) -> LiveStorageTracker:
    """The live-storage tracker for ``device``: its allocation blocks, and on the CPU the
    buffers its kernels allocate below dispatch (``workspace``)."""
    workspaces = None if device.host_bandwidth else Workspaces()
    return LiveStorageTracker(persistent, device.allocation_block, workspaces)


def instrumented_step(
    model_file: Workload,
    model: torch.nn.Module,
    inputs: Any,
    optimizer: torch.optim.Optimizer | None,
    blocks: Blocks,
    ops: OpRecorder,
    autocast: str | None,
) -> StepRecorder:
    """One unchecked step with phases marked, storages tracked and ops recorded."""
    persistent = persistent_tensors(model, optimizer, inputs)
    tracker = _tracker(persistent, ops.device)
    params = [p for p in model.parameters() if p.requires_grad]
    recorder = StepRecorder(blocks, tracker, ops, params)
    recorder.enclosing = EnclosureRecorder(model, blocks, tracker)
    with ExitStack() as stack:
        for handle in (*recorder.hooks(), *recorder.enclosing.hooks()):
            stack.callback(handle.remove)
        stack.enter_context(ops.modules)
        stack.enter_context(ops)
        stack.enter_context(tracker)
        stack.enter_context(gradients_counted(model, tracker))
        recorder.mark(Phase.pre(Direction.FORWARD))
        with (
            torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t),
            autocast_context(autocast, device_type(inputs)),
        ):
            loss = model_file.loss(call_model(model, inputs))
        recorder.mark(Phase.post(Direction.BACKWARD))
        loss.backward()
        del loss
        recorder.mark(Phase.optimizer())
        if optimizer is not None:
            optimizer.step()
        recorder.mark(Phase.end())
    return recorder


def drop_gradients(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Drop the gradients, as a training loop does between steps."""
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    else:
        model.zero_grad(set_to_none=True)


def device_type(inputs: Any) -> str:
    tensor = first_tensor(inputs)
    return tensor.device.type if tensor is not None else "cpu"


def plain_step(
    model_file: Workload,
    model: torch.nn.Module,
    inputs: Any,
    optimizer: torch.optim.Optimizer | None,
    autocast: str | None,
) -> None:
    """A warm-up step, so the optimizer state exists as it does in every later step."""
    with autocast_context(autocast, device_type(inputs)):
        loss = model_file.loss(call_model(model, inputs))
    loss.backward()
    if optimizer is not None:
        optimizer.step()
    drop_gradients(model, optimizer)


def _nograd_transients(
    model: torch.nn.Module,
    inputs: Any,
    blocks: Blocks,
    persistent: list[torch.Tensor],
    autocast: str | None,
    device: Device,
) -> list[int]:
    """Each block's forward peak above its start when it runs under ``no_grad``."""
    tracker = _tracker(persistent, device)
    recorder = StepRecorder(blocks, tracker, None, [])
    with ExitStack() as stack:
        for handle in recorder.hooks():
            stack.callback(handle.remove)
        stack.enter_context(torch.no_grad())
        stack.enter_context(autocast_context(autocast, device_type(inputs)))
        stack.enter_context(tracker)
        recorder.mark(Phase.pre(Direction.FORWARD))
        call_model(model, inputs)
    _every_block_ran(recorder)
    phases = {Phase.parse(p.label): p for p in tracker.phases}
    return [
        phases[Phase.forward(i)].peak - phases[Phase.forward(i)].start for i in range(len(blocks))
    ]
