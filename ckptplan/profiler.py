"""Profile a training step on fake tensors: the chain of blocks and what each one costs.

Everything runs under ``FakeTensorMode``, so a model far larger than this machine is profiled
without allocating its weights or activations. One instrumented, unchecked step records:

- a live-storage timeline split into phases (forward and backward of each block, the code
  before and after the blocks, the optimizer step), from which the chain model takes its figures;
- the tensors autograd saves (``saved_tensors_hooks``), attributed to the block that saves them;
- FLOPs and a roofline time per phase.

A second, ``no_grad`` forward gives each block's transient when it runs checkpointed.
"""

from __future__ import annotations

import functools
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch.utils import _pytree as pytree
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from ckptplan.costs import OpRecorder
from ckptplan.devices import Device, get_device
from ckptplan.enclosures import EnclosureRecorder
from ckptplan.errors import CkptplanError, option, raised_by_ckptplan
from ckptplan.fakepaths import real_step_paths
from ckptplan.fingerprint import inputs_signature, model_fingerprint
from ckptplan.gpukernels import GpuAttention
from ckptplan.loading import Workload, build_fake, call_model, describe_exception
from ckptplan.memtrack import (
    LiveStorageTracker,
    Phase,
    gradients_counted,
    storage_bytes,
)
from ckptplan.profile_types import (
    _EVENTS,
    BlockProfile,
    Gap,
    OpRecord,
    Profile,
    Settings,
    block_forward_records,
    replayed_count,
)
from ckptplan.replicate import MIN_RUN, CallSignatures, Run, find_runs, replicated
from ckptplan.steprecorder import QuietModuleTracker as _ModuleTracker
from ckptplan.steprecorder import StepRecorder
from ckptplan.training import (
    autocast_context,
    cast_floating,
    cast_model,
    first_tensor,
    fits_real_step,
    make_optimizer,
    parse_dtype,
    persistent_tensors,
    training_conventions,
)
from ckptplan.units import find_units
from ckptplan.workspace import Workspaces

MEASURED_STEPS = 3
"""Real steps timed op by op with ``--measure`` (each op's median is kept)."""

POLICY_PAIRS = 5
"""Back-to-back pairs of steps (plain checkpoint, recompute-all policy) that time a policy."""


def profile_model(
    model_file: Workload, settings: Settings, min_run: int | None = MIN_RUN
) -> Profile:
    """Profile one training step of the model file's model, allocating nothing.

    A run of at least ``min_run`` identical blocks is traced short and extrapolated exactly
    (``ckptplan.replicate``); None traces every block. An exception raised by the model's own
    code becomes a one-line error naming its line.
    """
    fake_tensor_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_tensor_log.level
    fake_tensor_log.setLevel(logging.CRITICAL)
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
    finally:
        fake_tensor_log.setLevel(level)


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
        if device.host_bandwidth and not real:  # a GPU's attention kernels (see gpukernels)
            paths.enter_context(GpuAttention())
        optimizer = make_optimizer(settings.optimizer, model)
        signatures = CallSignatures(model)
        try:
            with signatures.recording():
                blocks = find_units(
                    model,
                    lambda: _plain_step(model_file, model, inputs, optimizer, settings.autocast),
                    settings.blocks,
                )
            step = functools.partial(_traced, model_file, model, inputs, optimizer, device)
            if not (real or settings.measure or min_run is None):
                runs = find_runs(model, blocks, signatures, min_run)
                del signatures
                if runs:
                    replicated_profile, note = _replicated(
                        model_file, model, inputs, optimizer, blocks, runs, step, settings
                    )
                    if replicated_profile is not None:
                        return replace(
                            replicated_profile, notes=(*notes, *replicated_profile.notes)
                        )
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
        ops, policy_op_time = _measured_ops(model_file, settings, dtype, device, paths)
    profile = _assemble(
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
    return replace(profile, notes=notes)


def _traced(
    model_file: Workload,
    model: torch.nn.Module,
    inputs: Any,
    optimizer: torch.optim.Optimizer | None,
    device: Device,
    autocast: str | None,
    blocks: list[tuple[str, torch.nn.Module]],
) -> tuple[StepRecorder, OpRecorder, list[int], int]:
    """The instrumented step and the ``no_grad`` forward over ``blocks``, and the bytes that
    live across steps."""
    persistent = persistent_tensors(model, optimizer, inputs)
    ops = OpRecorder(device, _ModuleTracker())
    recorder = _instrumented_step(model_file, model, inputs, optimizer, blocks, ops, autocast)
    nograd = _nograd_transients(model, inputs, blocks, persistent, autocast, device)
    return recorder, ops, nograd, storage_bytes(persistent)


def _replicated(
    model_file: Workload,
    model: torch.nn.Module,
    inputs: Any,
    optimizer: torch.optim.Optimizer | None,
    blocks: list[tuple[str, torch.nn.Module]],
    runs: list[Run],
    step: Callable[..., tuple[StepRecorder, OpRecorder, list[int], int]],
    settings: Settings,
) -> tuple[Profile | None, str]:
    """The profile with the longest run of identical blocks priced once, or None and why
    not (the model is then traced whole)."""
    device = get_device(settings.device, settings.compiled)

    def trace(chain: list[tuple[str, torch.nn.Module]]) -> Profile:
        recorder, ops, nograd, persistent_bytes = step(settings.autocast, chain)
        return _assemble(
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
        _drop_gradients(model, optimizer)
        return None, f"repeated blocks were traced one by one: {exc}"


def _prepared(
    model: torch.nn.Module, inputs: Any, dtype: torch.dtype
) -> tuple[Any, Any, tuple[str, ...]]:
    inputs, notes = training_conventions(model, inputs)
    return cast_model(model, dtype).train(), cast_floating(inputs, dtype), notes


def _tracker(persistent: list[torch.Tensor], device: Device) -> LiveStorageTracker:
    """The live-storage tracker for ``device``: its allocation blocks, and on the CPU the
    buffers its kernels allocate below dispatch (``workspace``)."""
    workspaces = None if device.host_bandwidth else Workspaces()
    return LiveStorageTracker(persistent, device.allocation_block, workspaces)


def _instrumented_step(
    model_file: Workload,
    model: torch.nn.Module,
    inputs: Any,
    optimizer: torch.optim.Optimizer | None,
    blocks: list[tuple[str, torch.nn.Module]],
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
        recorder.mark("fwd:pre")
        with (
            torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t),
            autocast_context(autocast, _device_type(inputs)),
        ):
            loss = model_file.loss(call_model(model, inputs))
        recorder.mark("bwd:post")
        loss.backward()
        del loss
        recorder.mark("opt")
        if optimizer is not None:
            optimizer.step()
        recorder.mark("end")
    return recorder


def _measured_ops(
    model_file: Workload, settings: Settings, dtype: torch.dtype, device: Any, paths: list[str]
) -> tuple[OpRecorder, float]:
    """The same step run for real on this machine (outside the fake mode), every op timed,
    and the time a selective-checkpoint policy adds per op call here.

    Each op's time is its median over ``MEASURED_STEPS`` steps: on a shared CPU one step can
    land in a burst of contention (a 2-thread step took 0.6 s or 4.4 s on the same machine
    minutes apart, the optimizer's share 1% or 20%), which skews the split between forward and
    the rest that the predicted overhead is made of.
    """
    torch.manual_seed(0)
    model, inputs, _ = _prepared(model_file.build(), model_file.inputs(settings.batch_size), dtype)
    blocks = [(path, model.get_submodule(path)) for path in paths]
    optimizer = make_optimizer(settings.optimizer, model)
    _plain_step(model_file, model, inputs, optimizer, settings.autocast)
    steps: list[OpRecorder] = []
    for _ in range(MEASURED_STEPS):
        ops = OpRecorder(device, _ModuleTracker(), measure=True)
        _instrumented_step(model_file, model, inputs, optimizer, blocks, ops, settings.autocast)
        _drop_gradients(model, optimizer)
        steps.append(ops)
    measured = _median_times(steps)
    dispatched = _policy_dispatches(measured.records, len(blocks))
    extra = _policy_time(model_file, model, inputs, optimizer, blocks, settings.autocast)
    return measured, max(0.0, extra / dispatched) if dispatched else 0.0


def _policy_dispatches(records: list[OpRecord], blocks: int) -> int:
    """Op calls a selective policy sees when every block is checkpointed and recomputes all:
    each forward op, and in backward each op up to the block's last saved tensor."""
    return sum(len(ops) + replayed_count(ops) for ops in block_forward_records(records, blocks))


def _policy_time(
    model_file: Workload,
    model: torch.nn.Module,
    inputs: Any,
    optimizer: torch.optim.Optimizer | None,
    blocks: list[tuple[str, torch.nn.Module]],
    autocast: str | None,
) -> float:
    """What selective-checkpoint policies add to a step: the median, over back-to-back pairs,
    of a step with every block checkpointed under a recompute-everything policy minus the same
    step under plain checkpoint. Both recompute the same ops; the difference is the policy's
    dispatch modes, which see every op in forward and in recompute."""
    recompute_all = functools.partial(
        create_selective_checkpoint_contexts, lambda *_, **__: CheckpointPolicy.PREFER_RECOMPUTE
    )
    synchronize = torch.cuda.synchronize if _device_type(inputs) == "cuda" else lambda: None
    differences = []
    for i in range(POLICY_PAIRS):
        times = {}
        for policy in (None, recompute_all) if i % 2 == 0 else (recompute_all, None):
            with _checkpointed(blocks, policy):
                synchronize()
                start = time.perf_counter()
                _plain_step(model_file, model, inputs, optimizer, autocast)
                synchronize()
                times[policy] = time.perf_counter() - start
        differences.append(times[recompute_all] - times[None])
    return statistics.median(differences)


@contextmanager
def _checkpointed(
    blocks: list[tuple[str, torch.nn.Module]], context_fn: Callable[[], Any] | None
) -> Iterator[None]:
    """Every block's forward under ``torch.utils.checkpoint`` for the duration."""
    extra = {"context_fn": context_fn} if context_fn is not None else {}
    own = [(module, module.__dict__.get("forward")) for _, module in blocks]
    for module, _ in own:
        module.forward = functools.partial(checkpoint, module.forward, use_reentrant=False, **extra)
    try:
        yield
    finally:
        for module, forward in own:
            if forward is None:
                del module.forward
            else:
                module.forward = forward


def _median_times(steps: list[OpRecorder]) -> OpRecorder:
    """The last step's records, each op's time the median of its times in all ``steps``.

    Steps whose ops differ (control flow that depends on the data) are not matched op by op;
    then the step of median total time stands for them all.
    """
    last = steps[-1]
    names = [r.op for r in last.records]
    if any([r.op for r in s.records] != names for s in steps):
        return sorted(steps, key=lambda s: sum(r.time for r in s.records))[len(steps) // 2]
    last.records = [
        replace(r, time=statistics.median(s.records[i].time for s in steps))
        for i, r in enumerate(last.records)
    ]
    return last


def _drop_gradients(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Drop the gradients, as a training loop does between steps."""
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    else:
        model.zero_grad(set_to_none=True)


def _device_type(inputs: Any) -> str:
    tensor = first_tensor(inputs)
    return tensor.device.type if tensor is not None else "cpu"


def _plain_step(
    model_file: Workload,
    model: torch.nn.Module,
    inputs: Any,
    optimizer: torch.optim.Optimizer | None,
    autocast: str | None,
) -> None:
    """A warm-up step, so the optimizer state exists as it does in every later step."""
    with autocast_context(autocast, _device_type(inputs)):
        loss = model_file.loss(call_model(model, inputs))
    loss.backward()
    if optimizer is not None:
        optimizer.step()
    _drop_gradients(model, optimizer)


def _nograd_transients(
    model: torch.nn.Module,
    inputs: Any,
    blocks: list[tuple[str, torch.nn.Module]],
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
        stack.enter_context(autocast_context(autocast, _device_type(inputs)))
        stack.enter_context(tracker)
        recorder.mark("fwd:pre")
        call_model(model, inputs)
    phases = {p.label: p for p in tracker.phases}
    return [phases[f"fwd:{i}"].peak - phases[f"fwd:{i}"].start for i in range(len(blocks))]


def _assemble(
    model_file: Workload,
    model: torch.nn.Module,
    inputs: Any,
    settings: Settings,
    blocks: list[tuple[str, torch.nn.Module]],
    recorder: StepRecorder,
    costs: OpRecorder,
    nograd: list[int],
    persistent_bytes: int,
    optimizer: torch.optim.Optimizer | None,
    policy_op_time: float,
) -> Profile:
    phases = {p.label: p for p in recorder.tracker.phases}
    index_of = {p.label: i for i, p in enumerate(recorder.tracker.phases)}
    for i, (path, _) in enumerate(blocks):
        calls = recorder.calls[i].calls
        if calls != 1:
            raise CkptplanError(
                f"block {path} runs {calls} times in one forward; a block must run once "
                f"per step: choose other blocks with {option('blocks')}"
            )
        if f"bwd:{i}" not in phases:
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
        label = f"fwd:{i}"
        saved_here = recorder.saved.get(label, {})
        boundary = {call.input_key, call.output_key}
        saved_bytes = sum(
            size
            for key, (size, allocated) in saved_here.items()
            if allocated == index_of[label] and key not in boundary
        )
        before = recorder.saved.get(f"fwd:{i - 1}" if i else "fwd:pre", {})
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
        bwd_label = f"bwd:{i}"
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
                fwd_start=base + phases[label].start,
                fwd_peak=base + phases[label].peak,
                fwd_peak_nograd=nograd[i],
                bwd_start=base + phases[bwd_label].start,
                bwd_peak=base + phases[bwd_label].peak,
                grads_at_bwd_end=recorder.grads_at.get(f"{bwd_label}:end", 0),
                grads_at_bwd_start=phases[bwd_label].gradients_at_start,
                grads_at_bwd_peak=_gradients_at_peak(phases[bwd_label]),
                flops_fwd=flops[label],
                flops_bwd=flops[bwd_label],
                time_fwd=seconds[label],
                time_bwd=seconds[bwd_label],
                random=label in random_phases,
                stateful=_updates_buffers(module),
                own_output_bytes=call.output_bytes if own_output else 0,
                gap=_gap_after(i, recorder, phases, base, seconds),
                replay_peak=base + recorder.replay_peaks.get(label, phases[label].start),
            )
        )
    tail = tuple((base + phases[label].peak, _EVENTS[label]) for label in ("fwd:post", "bwd:post"))
    fixed = tuple(
        (base + phases[label].peak, _EVENTS[label])
        for label in ("fwd:pre", "bwd:pre", "opt")
        if label in phases
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
            (text, _gradients_at_peak(phases[label]))
            for label, text in _EVENTS.items()
            if label in phases
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
    phases: dict[str, Any],
    base: int,
    seconds: dict[str, float],
) -> Gap | None:
    """The code between block ``index`` and the next, when there is any."""
    following = index + 1
    if following >= len(recorder.calls) or not recorder.calls[following].gap_before:
        return None
    label = f"fwd:gap{index}"
    forward = phases[label]
    backward = phases.get(f"bwd:gap{index}")
    index_of = {p.label: i for i, p in enumerate(recorder.tracker.phases)}
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
            for key, (size, allocated) in recorder.saved.get(label, {}).items()
            if allocated == index_of[label] and key not in boundary
        ),
        fwd_time=seconds.get(label, 0.0),
    )


def _gradients_at_peak(phase: Phase) -> int:
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
