"""Op times measured on this machine (``--measure``): the step run for real, every op timed,
and the time a selective-checkpoint policy adds per op call here.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from ckptplan.devices import Device
from ckptplan.loading import Workload
from ckptplan.profiling.costs import OpRecorder
from ckptplan.profiling.steprecorder import QuietModuleTracker
from ckptplan.profiling.stepruns import (
    Blocks,
    device_type,
    drop_gradients,
    instrumented_step,
    plain_step,
)
from ckptplan.values.profile_types import OpRecord, block_forward_records, replayed_count

MEASURED_STEPS = 3
"""Real steps timed op by op with ``--measure`` (each op's median is kept)."""

POLICY_PAIRS = 5
"""Back-to-back pairs of steps (plain checkpoint, recompute-all policy) that time a policy."""


def measured_ops(
    model_file: Workload,
    model: torch.nn.Module,
    inputs: Any,
    optimizer: torch.optim.Optimizer | None,
    blocks: Blocks,
    device: Device,
    autocast: str | None,
) -> tuple[OpRecorder, float]:
    """The step of a real ``model`` (outside the fake mode), every op timed, and the time a
    selective-checkpoint policy adds per op call here.

    Each op's time is its median over ``MEASURED_STEPS`` steps: on a shared CPU one step can
    land in a burst of contention (a 2-thread step took 0.6 s or 4.4 s on the same machine
    minutes apart, the optimizer's share 1% or 20%), which skews the split between forward and
    the rest that the predicted overhead is made of.
    """
    plain_step(model_file, model, inputs, optimizer, autocast)
    steps: list[OpRecorder] = []
    for _ in range(MEASURED_STEPS):
        ops = OpRecorder(device, QuietModuleTracker(), measure=True)
        instrumented_step(model_file, model, inputs, optimizer, blocks, ops, autocast)
        drop_gradients(model, optimizer)
        steps.append(ops)
    measured = median_times(steps)
    dispatched = _policy_dispatches(measured.records, len(blocks))
    extra = _policy_time(model_file, model, inputs, optimizer, blocks, autocast)
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
    blocks: Blocks,
    autocast: str | None,
) -> float:
    """What selective-checkpoint policies add to a step: the median, over back-to-back pairs,
    of a step with every block checkpointed under a recompute-everything policy minus the same
    step under plain checkpoint. Both recompute the same ops; the difference is the policy's
    dispatch modes, which see every op in forward and in recompute."""
    recompute_all = functools.partial(
        create_selective_checkpoint_contexts, lambda *_, **__: CheckpointPolicy.PREFER_RECOMPUTE
    )
    synchronize = torch.cuda.synchronize if device_type(inputs) == "cuda" else lambda: None
    differences = []
    for i in range(POLICY_PAIRS):
        times = {}
        for policy in (None, recompute_all) if i % 2 == 0 else (recompute_all, None):
            with checkpointed(blocks, policy):
                synchronize()
                start = time.perf_counter()
                plain_step(model_file, model, inputs, optimizer, autocast)
                synchronize()
                times[policy] = time.perf_counter() - start
        differences.append(times[recompute_all] - times[None])
    return statistics.median(differences)


@contextmanager
def checkpointed(blocks: Blocks, context_fn: Callable[[], Any] | None) -> Iterator[None]:
    """Every block's forward under ``torch.utils.checkpoint`` for the duration."""
    extra = {"context_fn": context_fn} if context_fn is not None else {}
    modules = {id(module): module for _, module in blocks}  # a shared module once
    own = [(module, module.__dict__.get("forward")) for module in modules.values()]
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


def median_times(steps: list[OpRecorder]) -> OpRecorder:
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
