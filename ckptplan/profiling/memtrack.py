"""Live-storage accounting: the peak of a training step, on real or fake tensors alike.

A dispatch mode sees every aten op's outputs; each new storage is counted when it appears and
uncounted by a weakref finaliser when it dies, so views and in-place results are counted once.
Under ``FakeTensorMode`` the same accounting gives the real run's peak without allocating.
Storages that exist before tracking starts (parameters, optimizer state, inputs) are the
caller's to count; ``exclude`` keeps in-place updates of them from looking like new memory.

Where a CPU kernel's output holds more storage than its shape needs, a fake tensor cannot show
it; ``real_storage_bytes`` adds what such kernels are measured to hold (see ``_UNREDUCED_LOSSES``),
and the workspace recurrent kernels return, which their fake kernels return empty (``rnn``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import math
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _pop_mode_temporarily

from ckptplan.patching import patched
from ckptplan.profiling.gradsum import engine_sum_operand
from ckptplan.profiling.rnn import workspace_bytes

_UNREDUCED_LOSSES = frozenset(
    {
        torch.ops.aten.mse_loss.default,
        torch.ops.aten.smooth_l1_loss.default,
        torch.ops.aten.binary_cross_entropy.default,
        torch.ops.aten.soft_margin_loss.default,
    }
)
"""Losses whose CPU kernel, with reduction ``mean`` or ``sum``, returns the 0-dim loss in the
storage of the unreduced one (the size of the broadcast input), measured on torch 2.13: the
scalar loss of a step holds that storage until it dies. Their fake outputs hold one element.
``tests/test_accuracy_memtrack.py`` checks this list against the real kernels."""


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
"""glibc ``mallopt`` parameters (malloc.h)."""


def keep_freed_host_memory() -> None:
    """Make glibc's malloc keep freed memory for reuse, as CUDA's caching allocator does.

    By default glibc returns large freed blocks to the OS, so every step faults in fresh pages
    for its activations: hundreds of MiB per unchecked GPT step, a few for a checkpointed one.
    That cost is the host allocator's, not the plan's, and it skews measured step-time ratios
    by 5-10%; timing on CPU starts with this call. No block is mapped on its own (glibc maps
    every block above a threshold it caps at 32 MiB, such as HF Llama's logits at batch 4 and
    8192 tokens of vocabulary, 24,600 faults a compiled step) and the heap is never trimmed.
    It lasts for the process (an allocator setting cannot be scoped) and does nothing where
    the C library is not glibc.
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
        return
    libc.mallopt(_M_MMAP_MAX, 0)
    libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)


def real_storage_bytes(func: Any, args: Any, tensor: torch.Tensor) -> int:
    """Bytes behind ``tensor``, output of ``func(*args)``, as the real kernel allocates them.

    The same as the storage's size, except for an output of ``_UNREDUCED_LOSSES`` on the CPU,
    which is counted at the size of the unreduced loss whether the tensor is real or fake, and
    a recurrent kernel's workspace returned empty by its fake kernel.
    """
    size = tensor.untyped_storage().nbytes() or workspace_bytes(func, args, tensor)
    if func in _UNREDUCED_LOSSES and tensor.dim() == 0 and tensor.device.type == "cpu":
        shapes = [a.shape for a in args if isinstance(a, torch.Tensor)]
        elements = math.prod(torch.broadcast_shapes(*shapes)) if shapes else 1
        size = max(size, elements * tensor.element_size())
    return size


def storage_key(tensor: torch.Tensor) -> int:
    """An identity for the tensor's storage, shared by all its views."""
    return tensor.untyped_storage()._cdata


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen: dict[int, int] = {}
    for t in tensors:
        seen[storage_key(t)] = t.untyped_storage().nbytes()
    return sum(seen.values())


@dataclass
class TrackedPhase:
    """A labelled stretch of the step: live bytes at its start and the peak within it."""

    label: str
    start: int
    peak: int
    gradients_at_start: int = 0
    """Bytes of the parameters' gradients alive at the start."""
    activation_peak: int = 0
    """The peak of the live bytes that are not gradients (an activations budget's figure)."""


class LiveStorageTracker(TorchDispatchMode):
    """Tracks live bytes of storages created while active, with labelled phases."""

    engine_sums_in_place = True
    """Count the autograd engine's sums of gradients as the real engine makes them (``gradsum``)."""

    def __init__(
        self, exclude: Iterable[torch.Tensor] = (), block: int = 1, workspaces: Any = None
    ) -> None:
        super().__init__()
        self.workspaces = workspaces
        """``workspace.Workspaces`` on the CPU: buffers kernels allocate below dispatch."""
        self.block = block
        """Allocation granularity: CUDA's caching allocator rounds every block up to 512 B,
        which ``max_memory_allocated`` counts; 1 on the CPU."""
        self.live = 0
        self.peak = 0
        self.phases: list[TrackedPhase] = []
        self.allocated_in: dict[int, int] = {}
        """Storage key -> index of the phase that created it (to attribute saved tensors)."""
        self._sizes: dict[int, int] = {}
        self._known = {storage_key(t) for t in exclude}
        self.gradients = 0
        """Live bytes of the storages ``count_as_gradient`` named."""
        self.activation_peak = 0
        self._gradient_keys: set[int] = set()
        self._op: tuple[Any, Any] | None = None
        """The op whose outputs are being tracked, and its arguments."""
        self.ops = 0
        """Ops dispatched so far (to tell whether any code ran between two points)."""
        self._sum: tuple[int, int] | None = None
        """The autograd engine's last sum of gradients, counted in place until its first
        operand is seen to outlive it (``gradsum``): that operand's key, and the live bytes
        had the sum been out of place."""

    def __exit__(self, *exc: Any) -> None:
        self._settle_sum()
        super().__exit__(*exc)

    def mark(self, label: str) -> None:
        """Start a new phase now."""
        self._settle_sum()
        activations = self.live - self.gradients
        self.phases.append(TrackedPhase(label, self.live, self.live, self.gradients, activations))

    def count_as_gradient(self, tensor: torch.Tensor) -> None:
        """From now on, ``tensor``'s storage is a gradient: still live, but outside the
        activation figures (call it from a post-accumulate-grad hook: the instant it exists)."""
        key = storage_key(tensor)
        if key in self._sizes and key not in self._gradient_keys:
            self._gradient_keys.add(key)
            self.gradients += self._sizes[key]

    def rounded(self, nbytes: int) -> int:
        """``nbytes`` as the allocator hands them out (whole blocks)."""
        return -(-nbytes // self.block) * self.block

    def count(self, tensor: torch.Tensor) -> None:
        """Count a storage made outside dispatch (while it lives)."""
        self._settle_sum()
        self._track(tensor)

    def size_of(self, key: int) -> int:
        return self._sizes.get(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self._settle_sum()
        before = self.live
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        in_place = self.engine_sums_in_place
        operand = engine_sum_operand(func, args, kwargs or {}, out) if in_place else None
        self._op = (func, args)
        try:
            if operand is not None and storage_key(operand) in self._sizes:
                self._track(out, raise_peak=False)
                self._sum = (storage_key(operand), self.live)
            else:
                for leaf in pytree.tree_leaves(out):
                    if isinstance(leaf, torch.Tensor):
                        self._track(leaf)
        finally:
            self._op = None
        if self.workspaces is not None:
            inside = self.workspaces.peak_of(func, args, kwargs or {})
            if inside:
                self.peak_at(before + inside)
        return out

    def peak_at(self, live: int) -> None:
        """A moment inside an op when ``live`` bytes were live (its own buffers included)."""
        self.peak = max(self.peak, live)
        activations = live - self.gradients
        self.activation_peak = max(self.activation_peak, activations)
        if self.phases:
            phase = self.phases[-1]
            phase.peak = max(phase.peak, live)
            phase.activation_peak = max(phase.activation_peak, activations)

    def _settle_sum(self) -> None:
        """Once the sum is out of its op: where its first operand still lives, the real engine
        added out of place too, so its peak had both."""
        if self._sum is not None:
            operand, live = self._sum
            self._sum = None
            if operand in self._sizes:
                self.peak_at(live)

    def _track(self, tensor: torch.Tensor, raise_peak: bool = True) -> None:
        """Count ``tensor``'s storage if new, raising the peak unless told not to (a sum that
        may be in place)."""
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._sizes or key in self._known:
            return
        size = self.rounded(real_storage_bytes(*self._op, tensor) if self._op else storage.nbytes())
        self._sizes[key] = size
        self.allocated_in[key] = len(self.phases) - 1
        self.live += size
        if raise_peak:
            self.peak_at(self.live)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        size = self._sizes.pop(key, 0)
        self.live -= size
        if key in self._gradient_keys:
            self._gradient_keys.discard(key)
            self.gradients -= size


_FUSED: ContextVar[bool] = ContextVar("ckptplan_fused", default=False)
_COMPILED_STEP: ContextVar[CompiledStepTracker | None] = ContextVar(
    "ckptplan_compiled_step", default=None
)


@contextlib.contextmanager
def fused() -> Iterator[None]:
    """Ops run here make values a fused kernel keeps in registers: ``CompiledStepTracker``
    counts no storage for them."""
    token = _FUSED.set(True)
    try:
        yield
    finally:
        _FUSED.reset(token)


class CompiledStepTracker(LiveStorageTracker):
    """The tracker over a ``torch.compile``d step: declared an infrastructure mode, as dynamo
    runs compiled frames only under those. The graphs it then sees run eager kernels
    (``ckptplan.stepping.compiled.partitioning_backend``), so it counts every buffer they allocate.

    The partitioner replays a recomputed random op through a higher-order op that restores the
    RNG state (``run_with_rng_state``): it runs with this mode set aside, its outputs counted.
    """

    supports_higher_order_operators = True
    engine_sums_in_place = False
    """A compiled backward's graph sums gradients with its own adds, which inductor plans."""

    @classmethod
    def is_infra_mode(cls) -> bool:
        return True

    def __enter__(self) -> CompiledStepTracker:
        self._token = _COMPILED_STEP.set(self)
        return super().__enter__()  # type: ignore[no-any-return]

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        _COMPILED_STEP.reset(self._token)

    def tracked_bytes(self, tensors: Iterable[Any]) -> int:
        """Tracked bytes of the distinct storages of ``tensors``."""
        keys = {storage_key(t) for t in tensors if isinstance(t, torch.Tensor)}
        return sum(self.size_of(key) for key in keys)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if _FUSED.get():
            return func(*args, **(kwargs or {}))
        if not isinstance(func, torch._ops.HigherOrderOperator):
            return super().__torch_dispatch__(func, types, args, kwargs)
        before = self.live
        with _pop_mode_temporarily():
            out = func(*args, **(kwargs or {}))
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.count(leaf)
        inside = self.workspace_of(func, args, kwargs or {})
        if inside:
            self.peak_at(before + inside)
        return out

    def workspace_of(self, func: Any, args: Any, kwargs: Any) -> int:
        """Bytes ``func`` holds above its start at its peak, outputs and own buffers together
        (``workspace.Workspaces``); a higher-order op's are those of the op it runs (dropout's
        mask, replayed). 0 where no workspaces are measured."""
        if isinstance(func, torch._ops.HigherOrderOperator):
            index = next(
                (i for i, a in enumerate(args) if isinstance(a, torch._ops.OpOverload)), None
            )
            if index is None:
                return 0
            func, args = args[index], args[index + 1 :]
        return 0 if self.workspaces is None else self.workspaces.peak_of(func, args, kwargs)


def compiled_step_tracker() -> CompiledStepTracker | None:
    """The ``CompiledStepTracker`` counting the step now running, if any: a compiled graph
    runs below dispatch modes, so it reports its own buffers (``stepping.inductor_memory``)."""
    return _COMPILED_STEP.get()


@contextlib.contextmanager
def on_accumulated(
    model: torch.nn.Module | None, fn: Callable[[torch.Tensor], None]
) -> Iterator[None]:
    """Call ``fn(parameter)`` each time a trainable parameter's gradient is accumulated."""
    hooks = [
        p.register_post_accumulate_grad_hook(fn)
        for p in (model.parameters() if model is not None else ())
        if p.requires_grad
    ]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def gradients_counted(model: torch.nn.Module, tracker: LiveStorageTracker) -> Any:
    """Tell ``tracker`` of each parameter's gradient the moment it is accumulated."""
    return on_accumulated(model, lambda p: tracker.count_as_gradient(p.grad))


@contextlib.contextmanager
def rng_states_counted(tracker: LiveStorageTracker) -> Iterator[None]:
    """Count the CPU RNG states ``torch.utils.checkpoint`` stashes, one per region in flight
    (``preserve_rng_state``), and the copy its recomputation holds while replaying them.

    The generator makes them outside aten dispatch, so the tracker would miss them. Only for
    ckptplan's own instrumented steps (the fake run, ``verify``'s tracker figure): the wrapper
    is removed on exit. A process-wide patch, under ``patching``'s lock (Note [process-wide
    patches]): checkpoint calls ``torch.get_rng_state`` itself, and no dispatch mode sees it.
    """
    original = torch.get_rng_state

    def counted() -> torch.Tensor:
        state = original()
        tracker.count(state)
        return state

    with patched(torch, "get_rng_state", counted):
        yield
