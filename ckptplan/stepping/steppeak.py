"""One training step, run for its memory: the peak of a steady-state step (forward, backward,
optimizer step, the optimizer state already created), by the device's allocator or by the
profiler's live-storage tracker.

On CUDA the allocator's figure is ``torch.cuda.max_memory_allocated``; on CPU it is the
allocator's own event stream (``ckptplan.profiling.allocmeter``) plus the bytes that persist across
steps. The tracker's figure is the one the fake run, on fake tensors, can take: beside the
allocator's it shows what the tracker misses.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from ckptplan.applying.tensors import input_tensors
from ckptplan.callerstate import seed_all
from ckptplan.loading import Workload, call_model
from ckptplan.profiling.allocmeter import allocator_peak
from ckptplan.profiling.memtrack import (
    LiveStorageTracker,
    gradients_counted,
    rng_states_counted,
    storage_bytes,
)
from ckptplan.profiling.training import (
    autocast_context,
    every_layer_runs,
    persistent_tensors,
)
from ckptplan.profiling.workspace import Workspaces


@dataclass
class StepRun:
    """What one training step runs: the model, its optimizer (none: gradients are dropped),
    the batch and the autocast dtype."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    inputs: Any
    autocast: str | None = None


def train_step(model_file: Workload, run: StepRun, seed: int) -> None:
    """One seeded training step, leaving no gradients behind, so every step starts alike."""
    seed_all(seed)
    device_type = next(input_tensors(run.inputs), torch.empty(0)).device.type
    with autocast_context(run.autocast, device_type):
        loss = model_file.loss(call_model(run.model, run.inputs))
    loss.backward()
    del loss
    if run.optimizer is not None:
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
    else:
        run.model.zero_grad(set_to_none=True)


def measured_peak(
    model_file: Workload, run: StepRun, device: torch.device, scope: str = "step"
) -> tuple[int, int | None]:
    """Peak bytes of one steady-state step by the device's allocator: CUDA's statistics, or
    on CPU the allocator's event stream (``allocmeter``). In scope ``activations`` without the
    parameters, optimizer state and batch, and on CPU without each gradient from the moment it
    exists (on CUDA the gradients stay in: an upper bound). With it, on CUDA, the peak the
    caching allocator reserved (``max_memory_reserved``, the same bytes taken off). Every
    layer runs, LayerDrop or not, as in the step the plan was priced for."""
    with every_layer_runs(run.model):
        return _measured_peak(model_file, run, device, scope)


def _measured_peak(
    model_file: Workload, run: StepRun, device: torch.device, scope: str
) -> tuple[int, int | None]:
    train_step(model_file, run, seed=1)
    persistent = storage_bytes(persistent_tensors(run.model, run.optimizer, run.inputs))
    if device.type == "cuda":
        outside = persistent if scope != "step" else 0
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        train_step(model_file, run, seed=2)
        torch.cuda.synchronize(device)
        allocated = torch.cuda.max_memory_allocated(device) - outside
        return allocated, torch.cuda.max_memory_reserved(device) - outside
    peak = allocator_peak(lambda: train_step(model_file, run, seed=2), run.model)
    return (peak.activations if scope == "activations" else persistent + peak.step), None


def tracked_peak(
    model_file: Workload,
    run: StepRun,
    scope: str = "step",
    host_memory: bool = True,
    block: int = 1,
    tracker_type: type[LiveStorageTracker] = LiveStorageTracker,
) -> int:
    """The same peak counted by the live-storage tracker the profiler uses (which also runs
    on fake tensors), plus, where the device memory is host memory, the CPU RNG states that
    checkpoints stash outside dispatch."""
    train_step(model_file, run, seed=1)
    persistent = persistent_tensors(run.model, run.optimizer, run.inputs)
    workspaces = Workspaces() if host_memory else None
    tracker = tracker_type(persistent, block, workspaces)
    states = rng_states_counted(tracker) if host_memory else nullcontext()
    with tracker, gradients_counted(run.model, tracker), states:
        train_step(model_file, run, seed=2)
    if scope == "activations":
        return tracker.activation_peak
    return storage_bytes(persistent) + tracker.peak
