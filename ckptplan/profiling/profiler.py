"""Profile a training step on fake tensors: the chain of blocks and what each one costs.

Everything runs under ``FakeTensorMode``, so a model far larger than this machine is profiled
without allocating its weights or activations. One instrumented, unchecked step records:

- a live-storage timeline split into phases (forward and backward of each block, the code
  before and after the blocks, the optimizer step), from which the chain model takes its figures;
- the tensors autograd saves (``saved_tensors_hooks``), attributed to the block that saves them;
- FLOPs and a roofline time per phase.

A second, ``no_grad`` forward gives each block's transient when it runs checkpointed.

Here: which step runs (fake, or real when fake tensors cannot run it; a run of identical
blocks traced short). ``ckptplan.profiling.stepruns`` runs the steps,
``ckptplan.profiling.steptiming`` times ops for real (``--measure``),
``ckptplan.profiling.assembly`` turns the records into a ``Profile``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)

from ckptplan.applying.gpukernels import GpuAttention
from ckptplan.applying.layered_rnn import layer_by_layer
from ckptplan.devices import Device, get_device
from ckptplan.errors import CkptplanError, raised_by_ckptplan
from ckptplan.huggingface import training_conventions
from ckptplan.loading import Workload, build_fake, describe_exception
from ckptplan.profiling.assembly import assemble
from ckptplan.profiling.costs import OpRecorder
from ckptplan.profiling.everyblock import EveryBlockRuns
from ckptplan.profiling.fakepaths import real_step_paths
from ckptplan.profiling.memtrack import storage_bytes
from ckptplan.profiling.replicate import MIN_RUN, CallSignatures, Run, find_runs, replicated
from ckptplan.profiling.steprecorder import StepRecorder
from ckptplan.profiling.stepruns import Blocks, drop_gradients, plain_step, traced
from ckptplan.profiling.steptiming import measured_ops
from ckptplan.profiling.training import (
    cast_floating,
    cast_model,
    fits_real_step,
    make_optimizer,
    parse_dtype,
)
from ckptplan.profiling.units import find_units
from ckptplan.quietlogs import torch_logs_quieted
from ckptplan.values.profile_types import Profile, Settings
from ckptplan.values.unit_names import split_unit


@torch_logs_quieted()
def profile_model(
    model_file: Workload, settings: Settings, min_run: int | None = MIN_RUN
) -> Profile:
    """Profile one training step of the model file's model, allocating nothing.

    A run of at least ``min_run`` identical blocks is traced short and extrapolated exactly
    (``ckptplan.profiling.replicate``); None traces every block. An exception raised by the model's
    own code becomes a one-line error naming its line.
    """
    try:
        return _profile(model_file, settings, min_run)
    except CkptplanError:
        raise
    except Exception as exc:
        if raised_by_ckptplan(exc):
            raise
        file = getattr(model_file, "path", None)
        raise CkptplanError(
            f"running {model_file.name} failed: {describe_exception(exc, file)}"
        ) from None


class _FakeStepFailed(Exception):
    """Fake tensors cannot run the step: it reads tensor values (``nonzero``, token routing)
    or an op's fake kernel refuses what its CPU kernel runs (``_grouped_mm`` in fp32)."""

    def __init__(self, cause: Exception, parameter_bytes: int) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.parameter_bytes = parameter_bytes

    def reason(self, file: Path | None) -> str:
        if isinstance(self.cause, DataDependentOutputException | DynamicOutputShapeException):
            op = getattr(self.cause, "func", None) or type(self.cause).__name__
            return f"{op} depends on tensor values"
        return f"fake tensors cannot run it ({describe_exception(self.cause, file)})"


def _profile(model_file: Workload, settings: Settings, min_run: int | None) -> Profile:
    """The fake step, or a real one on this machine when fake tensors cannot run the step
    (the token routing of a mixture of experts, ``nonzero``) and the model fits here. A real
    step that fails too is reported as the model's error."""
    try:
        return _profile_step(model_file, settings, real=False, min_run=min_run)
    except _FakeStepFailed as failed:
        file = getattr(model_file, "path", None)
        if not fits_real_step(failed.parameter_bytes):
            raise CkptplanError(
                f"{model_file.name} cannot be profiled on fake tensors: {failed.reason(file)}; "
                f"and it is too large for a real step here ({failed.parameter_bytes / 2**30:.1f}"
                " GiB of parameters): profile a smaller configuration of it"
            ) from None
        profile = _profile_step(model_file, settings, real=True, min_run=None)
        note = (
            f"profiled with a real step on this machine: {failed.reason(file)}; sizes that "
            "depend on values (e.g. tokens per expert) are those this batch and these weights give"
        )
        return replace(profile, notes=(*profile.notes, note))


def _profile_step(
    model_file: Workload, settings: Settings, real: bool, min_run: int | None
) -> Profile:
    device = get_device(settings.device, settings.compiled)
    dtype = parse_dtype(settings.dtype)
    with (
        nullcontext() if real else FakeTensorMode(allow_non_fake_inputs=True),
        ExitStack() as paths,
    ):
        torch.manual_seed(0)
        model = model_file.build() if real else build_fake(model_file)
        inputs = model_file.inputs(settings.batch_size)
        model, inputs, notes = _prepared(model, inputs, dtype)
        paths.enter_context(real_step_paths(inputs))
        every_block = paths.enter_context(EveryBlockRuns())
        if device.host_bandwidth and not real:  # a GPU's attention kernels (see gpukernels)
            paths.enter_context(GpuAttention())
        optimizer = make_optimizer(settings.optimizer, model)
        signatures = CallSignatures(model)
        try:
            with signatures.recording():
                blocks = find_units(
                    model,
                    lambda: plain_step(model_file, model, inputs, optimizer, settings.autocast),
                    settings.blocks,
                )
            step = functools.partial(traced, model_file, model, inputs, optimizer, device)
            if not (real or settings.measure or min_run is None):
                runs = find_runs(model, blocks, signatures, min_run)
                del signatures
                if runs:
                    replicated_profile, note = _replicated(
                        model_file, model, inputs, optimizer, blocks, runs, step, settings
                    )
                    if replicated_profile is not None:
                        notes = (*notes, *replicated_profile.notes, *_drawn(every_block))
                        return replace(replicated_profile, notes=notes)
                    notes = (*notes, note)
            recorder, ops, nograd, persistent_bytes = step(settings.autocast, blocks)
        except CkptplanError:
            raise
        except Exception as exc:
            if real or raised_by_ckptplan(exc):
                raise
            raise _FakeStepFailed(exc, storage_bytes(model.parameters())) from None
    policy_op_time = device.policy_op_time
    if settings.measure:
        paths = [path for path, _ in blocks]
        ops, policy_op_time = _measured(model_file, settings, dtype, device, paths)
    profile = assemble(
        model_file,
        model,
        inputs,
        settings,
        blocks,
        recorder,
        ops,
        nograd,
        persistent_bytes,
        optimizer,
        policy_op_time,
    )
    return replace(profile, notes=(*notes, *_drawn(every_block)))


def _drawn(every_block: EveryBlockRuns) -> tuple[str, ...]:
    return (EveryBlockRuns.NOTE,) if every_block.draws else ()


def _replicated(
    model_file: Workload,
    model: torch.nn.Module,
    inputs: Any,
    optimizer: torch.optim.Optimizer | None,
    blocks: Blocks,
    runs: list[Run],
    step: Callable[..., tuple[StepRecorder, OpRecorder, list[int], int]],
    settings: Settings,
) -> tuple[Profile | None, str]:
    """The profile with the longest run of identical blocks priced once, or None and why
    not (the model is then traced whole)."""
    device = get_device(settings.device, settings.compiled)

    def trace(chain: Blocks) -> Profile:
        recorder, ops, nograd, persistent_bytes = step(settings.autocast, chain)
        return assemble(
            model_file,
            model,
            inputs,
            settings,
            chain,
            recorder,
            ops,
            nograd,
            persistent_bytes,
            optimizer,
            device.policy_op_time,
        )

    try:
        return replicated(model, optimizer, blocks, max(runs, key=lambda r: r.length), trace), ""
    except Exception as exc:  # any failure of the short traces: trace the whole model instead
        drop_gradients(model, optimizer)
        return None, f"repeated blocks were traced one by one: {exc}"


def _prepared(
    model: torch.nn.Module, inputs: Any, dtype: torch.dtype
) -> tuple[Any, Any, tuple[str, ...]]:
    inputs, notes = training_conventions(model, inputs)
    layer_by_layer(model)  # as apply will: the layers of stacked LSTMs are units
    return cast_model(model, dtype).train(), cast_floating(inputs, dtype), notes


def _measured(
    model_file: Workload, settings: Settings, dtype: torch.dtype, device: Device, paths: list[str]
) -> tuple[OpRecorder, float]:
    """The ops of the same step run for real on this machine (outside the fake mode), each
    timed, and the time a selective-checkpoint policy adds per op call here."""
    torch.manual_seed(0)
    model, inputs, _ = _prepared(model_file.build(), model_file.inputs(settings.batch_size), dtype)
    blocks = [(path, model.get_submodule(split_unit(path)[0])) for path in paths]
    optimizer = make_optimizer(settings.optimizer, model)
    return measured_ops(model_file, model, inputs, optimizer, blocks, device, settings.autocast)
