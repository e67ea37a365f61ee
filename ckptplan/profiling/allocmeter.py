"""The CPU allocator's own account of a step's memory: an instrument independent of the tracker.

The profiler and the fake run count live storages through a dispatch mode, so a check made
with that same tracker cannot catch what it misses: memory allocated outside aten dispatch
(the RNG state a checkpoint stashes), or storages it misattributes. ``torch.profiler`` with
``profile_memory=True`` records every allocation and free the c10 CPU allocator makes, with its
size; summing them in time order gives the live bytes the allocator saw, whatever made them.

For an activations budget, a parameter's gradient leaves the figure the moment it is
accumulated, as in the prediction: a post-accumulate hook drops a marker into the same event
stream, so the marker and the allocations share one clock.

Example:
    >>> x = torch.randn(256, 256, requires_grad=True)
    >>> peak = allocator_peak(lambda: (x @ x).sum().backward())
    >>> peak.step >= 2 * 256 * 256 * 4   # the product, then the gradient of x
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile, record_function

from ckptplan.patching import patched_env
from ckptplan.profiling.memtrack import on_accumulated

_MARK = "ckptplan::gradient@"
_LOG_LEVEL = "KINETO_LOG_LEVEL"


@dataclass(frozen=True)
class AllocatorPeak:
    """Peak bytes the allocator had live during the step, above what was live at its start:
    all of it, and without each parameter gradient from the moment it is accumulated."""

    step: int
    activations: int


def allocator_peak(step: Callable[[], None], model: torch.nn.Module | None = None) -> AllocatorPeak:
    """Run ``step`` once under the allocator's event stream and read its peaks; the gradients
    of ``model``'s parameters are marked as they are accumulated."""
    with (
        _quiet_profiler(),
        # One cycle: accumulating its events changes nothing, and keeps torch 2.11 from
        # warning that a cycle clears them.
        profile(activities=[ProfilerActivity.CPU], profile_memory=True, acc_events=True) as prof,
        _gradient_marks(model),
    ):
        step()
    events = sorted(_events(prof.profiler.kineto_results.experimental_event_tree()))
    live = gradients = 0
    step_peak = activation_peak = 0
    sizes: dict[int, int] = {}
    marked: set[int] = set()
    for _, kind, pointer, size in events:
        if kind == "mark":
            if pointer in sizes and pointer not in marked:
                marked.add(pointer)
                gradients += sizes[pointer]
            continue
        live += size
        if size > 0:
            sizes[pointer] = size
        else:
            sizes.pop(pointer, None)
            if pointer in marked:
                marked.discard(pointer)
                gradients += size
        step_peak = max(step_peak, live)
        activation_peak = max(activation_peak, live - gradients)
    return AllocatorPeak(step_peak, activation_peak)


@contextlib.contextmanager
def _quiet_profiler() -> Iterator[None]:
    """Without the profiler's start and stop lines on stderr: its log level is read when it
    first starts, so it is set for that moment only (a level the caller set is kept).

    ``torch.profiler`` takes no log level, so this is a process-wide patch, under
    ``patching``'s lock (Note [process-wide patches])."""
    with patched_env(_LOG_LEVEL, "6"):
        yield


def _gradient_marks(model: torch.nn.Module | None) -> Any:
    def mark(parameter: torch.Tensor) -> None:
        if parameter.grad is not None:
            with record_function(f"{_MARK}{parameter.grad.untyped_storage().data_ptr()}"):
                pass

    return on_accumulated(model, mark)


def _events(nodes: Any) -> Iterator[tuple[int, str, int, int]]:
    """(time, "alloc" or "mark", address, signed bytes) of every CPU allocation and marker."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation:
            fields = node.extra_fields
            if fields.device.type == "cpu":
                yield node.start_time_ns, "alloc", fields.ptr, fields.alloc_size
        elif node.name.startswith(_MARK):
            yield node.start_time_ns, "mark", int(node.name.removeprefix(_MARK)), 0
