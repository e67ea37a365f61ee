"""The fake run: a plan's step peak taken by running the real checkpointed code (``apply``,
``torch.utils.checkpoint``, or ``torch.compile``'s partition) on fake tensors and counting live
storages, so the chain model's prediction is confirmed without a device and nothing allocated.
"""

from __future__ import annotations

import functools
from contextlib import nullcontext

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ckptplan.applying.gpukernels import GpuAttention
from ckptplan.applying.guards import GUARD_WARNINGS
from ckptplan.applying.install import apply
from ckptplan.devices import get_device
from ckptplan.errors import CkptplanError, raised_by_ckptplan
from ckptplan.huggingface import training_conventions
from ckptplan.loading import Workload, build_fake
from ckptplan.profiling.everyblock import EveryBlockRuns
from ckptplan.profiling.fakepaths import real_step_paths
from ckptplan.profiling.memtrack import CompiledStepTracker, LiveStorageTracker
from ckptplan.profiling.training import (
    cast_floating,
    cast_model,
    fits_real_step,
    make_optimizer,
    parse_dtype,
)
from ckptplan.quietlogs import fake_run_logs_quieted
from ckptplan.stepping.compiled import CompiledModel, Partition, partitioning_backend
from ckptplan.stepping.graphbreaks import counting_breaks
from ckptplan.stepping.graphcost import graph_seconds
from ckptplan.stepping.steppeak import StepRun, measured_peak, tracked_peak
from ckptplan.values.plan import Plan


@fake_run_logs_quieted(GUARD_WARNINGS)
def fake_run_peak(model_file: Workload, plan: Plan) -> int:
    """The plan's steady-state step peak, executed under ``FakeTensorMode``: nothing allocated.

    This runs the real checkpointed code (``apply``, ``torch.utils.checkpoint``) and counts
    live storages, so it confirms the chain model's prediction without a device. A plan made
    for ``torch.compile`` runs compiled (``compiled_fake_run``).
    """
    if plan.settings.compiled:
        return compiled_fake_run(model_file, plan)[0]
    try:
        return _checkpointed_step_peak(model_file, plan, real=False)
    except CkptplanError:
        raise
    except Exception as exc:
        # The profile took a real step for such a model; a real error shows again there.
        size = 4 * int(plan.fingerprint.get("parameters", 0))
        if raised_by_ckptplan(exc) or not fits_real_step(size):
            raise
        return _checkpointed_step_peak(model_file, plan, real=True)


@fake_run_logs_quieted(GUARD_WARNINGS)
def compiled_fake_run(model_file: Workload, plan: Plan) -> tuple[int, Partition]:
    """The step peak of ``torch.compile`` after ``apply(model, plan)`` (a plan of no regions:
    the unchecked model), and the partition it made (with the graphs compiled and the graph
    breaks), on fake tensors: inductor's decompositions and
    partitioner with eager kernels (``ckptplan.stepping.compiled``). The caller's own compiled code
    is left as it was (Note [compiling without touching the caller's caches]).
    """
    log = Partition()
    peak = _checkpointed_step_peak(model_file, plan, real=False, compiled=log)
    return peak, log


def _checkpointed_step_peak(
    model_file: Workload,
    plan: Plan,
    real: bool,
    compiled: Partition | None = None,
) -> int:
    """The plan's step peak on fake tensors, or for a step fake tensors cannot run (token
    routing) a real one on this machine's CPU, as the profile then took. With ``compiled``,
    the step runs ``torch.compile``d, its partition written there."""
    settings = plan.settings
    dtype = parse_dtype(settings.dtype)
    with nullcontext() if real else FakeTensorMode(allow_non_fake_inputs=True):
        torch.manual_seed(0)
        model = model_file.build() if real else build_fake(model_file)
        inputs, _ = training_conventions(model, model_file.inputs(settings.batch_size))
        model = cast_model(model, dtype).train()
        apply(model, plan, force=True)
        inputs = cast_floating(inputs, dtype)
        optimizer = make_optimizer(settings.optimizer, model)
        if compiled is not None:
            price = functools.partial(graph_seconds, device=get_device(settings.device, True))
            model = CompiledModel(model, partitioning_backend(compiled, price))
        run = StepRun(model, optimizer, inputs, settings.autocast)
        target = get_device(settings.device)
        host = not target.host_bandwidth
        kernels = GpuAttention() if not host and not real else nullcontext()
        # torch.compile runs no frame under a dispatch mode: a compiled step draws as it does.
        every_block = EveryBlockRuns() if compiled is None else counting_breaks(compiled)
        with real_step_paths(inputs, compiled is not None), kernels, every_block:
            scope = settings.scope
            if real:  # a real step here: the allocator's own figure, as verify takes it
                return measured_peak(model_file, run, torch.device("cpu"), scope)[0]
            tracker = LiveStorageTracker if compiled is None else CompiledStepTracker
            return tracked_peak(model_file, run, scope, host, target.allocation_block, tracker)
