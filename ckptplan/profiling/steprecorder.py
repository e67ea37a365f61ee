"""The hooks that mark the phases of one instrumented training step on the live-storage
tracker: each block's forward and backward, the code between blocks, the saved tensors.

``ckptplan.profiling.profiler`` runs the step and turns what these recorded into a ``Profile``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.graph import register_multi_grad_hook
from torch.nn.modules.module import register_module_forward_hook
from torch.utils import _pytree as pytree
from torch.utils.module_tracker import ModuleTracker

from ckptplan.applying.tensors import first_tensor
from ckptplan.profiling.callhooks import unit_hooks
from ckptplan.profiling.costs import OpRecorder
from ckptplan.profiling.enclosures import EnclosureRecorder
from ckptplan.profiling.everyblock import host_random_state
from ckptplan.profiling.memtrack import LiveStorageTracker, storage_bytes, storage_key
from ckptplan.values.phase import Direction, Phase


class QuietModuleTracker(ModuleTracker):
    """``ModuleTracker`` that never holds a gradient, so the step it watches keeps what an
    unwatched step keeps.

    torch's tracker marks a module's backward done when the gradients of *all* its inputs
    exist, buffering the first ones until the last arrives: the U-Net decoder's input gradient
    waited for its skip's, 7.5 MiB more live through the encoder's backward than a plain step.
    Here the first input gradient ends the module's backward (``mode="any"``).

    torch's tracker also watches only positional inputs: a module called with its input as a
    keyword (Hugging Face's ``self_attn(hidden_states=...)``) never left backward, so every
    later backward op was named after the deepest such module of any later block. Here the
    inputs are watched when the forward returns, keywords included (a hook on a tensor keeps
    neither it nor its gradient).
    """

    def __enter__(self) -> QuietModuleTracker:
        super().__enter__()
        self._fw_post_handle.remove()
        self._fw_post_handle = register_module_forward_hook(self._fw_post_hook, with_kwargs=True)
        return self

    def _fw_pre_hook(self, mod: torch.nn.Module, input: Any) -> None:
        self._get_append_fn(self._get_mod_name(mod), False)()

    def _fw_post_hook(  # type: ignore[override]
        self, mod: torch.nn.Module, input: Any, kwargs: Any, output: Any
    ) -> None:
        name = self._get_mod_name(mod)
        self._get_pop_fn(name, False)()
        self._watch((input, kwargs), self._get_pop_fn(name, True))
        self._watch(output, self._get_append_fn(name, True))

    def _watch(self, tree: Any, fn: Any) -> None:
        tensors = [
            t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor) and t.requires_grad
        ]
        if tensors:
            self._hooks.append(register_multi_grad_hook(tensors, fn, mode="any"))


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _same_arguments(a: Any, b: Any) -> bool:
    """Whether two calls passed the same extra arguments (tensors by identity)."""
    leaves_a, spec_a = pytree.tree_flatten(a)
    leaves_b, spec_b = pytree.tree_flatten(b)
    if spec_a != spec_b:
        return False
    for x, y in zip(leaves_a, leaves_b, strict=True):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if x is not y:
                return False
        elif x != y:
            return False
    return True


@dataclass
class _BlockCall:
    input_key: int | None = None
    input_bytes: int = 0
    output_key: int | None = None
    output_bytes: int = 0
    joins_previous: bool = False
    gap_before: bool = False
    """Code runs between the previous block and this one (this block's input is not the
    previous block's output)."""
    calls: int = 0
    output: weakref.ref[torch.UntypedStorage] | None = None
    """The output's storage, watched to see what keeps it alive in backward."""
    output_alive_at_bwd: bool = False
    output_died_in_bwd: bool = False


class StepRecorder:
    """Module and tensor hooks that mark the phases of one step on the tracker."""

    def __init__(
        self,
        blocks: list[tuple[str, torch.nn.Module]],
        tracker: LiveStorageTracker,
        costs: OpRecorder | None,
        params: list[torch.nn.Parameter],
    ) -> None:
        self.blocks = blocks
        self.tracker = tracker
        self.costs = costs
        self.params = params
        self.calls = [_BlockCall() for _ in blocks]
        self.saved: dict[Phase, dict[int, tuple[int, int | None]]] = {}
        """Phase -> {storage key: (bytes, index of the phase that allocated it)}."""
        self.grads_at_end: dict[Phase, int] = {}
        """Phase -> gradient bytes present when it ended."""
        self.replay_peaks: dict[Phase, int] = {}
        """Phase -> its peak up to the last tensor it saved (where recomputation stops)."""
        self.enclosing: EnclosureRecorder | None = None
        self.extra_inputs: dict[int, int] = {}
        """Storage key -> the last block that took it as an argument beyond its first."""
        self._previous: tuple[torch.Tensor | None, Any] = (None, None)
        self._gap_state: tuple[int, int] | None = None
        """``_state()`` when the last block returned (see ``_state``)."""
        self.phase = Phase.start()
        """The phase running now."""

    def mark(self, phase: Phase) -> None:
        if self.tracker.phases:
            ending = self.phase
            self.grads_at_end[ending] = self._grad_bytes()
            if ending.is_backward and ending.block_index is not None:
                call = self.calls[ending.block_index]
                call.output_died_in_bwd = call.output is not None and call.output() is None
        if phase.is_backward and phase.block_index is not None:
            call = self.calls[phase.block_index]
            call.output_alive_at_bwd = call.output is not None and call.output() is not None
        self.phase = phase
        self.tracker.mark(phase.label)
        if self.costs is not None:
            self.costs.phase = phase.label

    def _state(self) -> tuple[int, int]:
        """The ops dispatched so far and a digest of the host's random generators.

        Note [joining blocks]: a region of several blocks runs them back to back from the
        first one's call, so it may join a block to the one before only if nothing runs
        between them: no op (a LayerDrop draw, ``torch.rand([]) < p``, or any other code whose
        order the region would change) and no draw from Python's or NumPy's generators (a
        LayerDrop written with ``random.random()``). Anything between keeps them apart.
        """
        return self.tracker.ops, host_random_state()

    def _grad_bytes(self) -> int:
        return storage_bytes(p.grad for p in self.params if p.grad is not None)

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key = storage_key(tensor)
        size = self.tracker.size_of(key) or self.tracker.rounded(tensor.untyped_storage().nbytes())
        self.saved.setdefault(self.phase, {})[key] = (size, self.tracker.allocated_in.get(key))
        if self.tracker.phases:
            self.replay_peaks[self.phase] = self.tracker.phases[-1].peak
        if self.costs is not None:
            self.costs.note_saved(size, key)
        return tensor

    def hooks(self) -> Iterator[Any]:
        yield from unit_hooks(self.blocks, self._pre, self._post, with_kwargs=True)

    def _pre(self, index: int) -> Any:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            call = self.calls[index]
            call.calls += 1
            x = first_tensor(args) if args else first_tensor(kwargs)
            self.mark(Phase.forward(index))
            if x is None:
                return
            call.input_key = storage_key(x)
            call.input_bytes = self.tracker.rounded(x.untyped_storage().nbytes())
            previous_out, previous_rest = self._previous
            rest = (
                (args[1:], kwargs)
                if args
                else ((), {k: v for k, v in kwargs.items() if v is not x})
            )
            follows = index > 0 and previous_out is not None and x is previous_out
            call.gap_before = index > 0 and not follows
            call.joins_previous = (
                follows
                and self._gap_state == self._state()
                and _same_arguments(rest, previous_rest)
                and _parent(self.blocks[index][0]) == _parent(self.blocks[index - 1][0])
            )
            self._previous = (None, rest)
            for leaf in pytree.tree_leaves(rest):
                if isinstance(leaf, torch.Tensor):
                    self.extra_inputs[storage_key(leaf)] = index
            if x.requires_grad and (index == 0 or call.gap_before):
                phase = (
                    Phase.pre(Direction.BACKWARD)
                    if index == 0
                    else Phase.gap(Direction.BACKWARD, index - 1)
                )
                x.register_hook(lambda grad: self.mark(phase))

        return hook

    def _post(self, index: int) -> Any:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            out = first_tensor(output)
            call = self.calls[index]
            if out is not None:
                call.output_key = storage_key(out)
                call.output_bytes = self.tracker.rounded(out.untyped_storage().nbytes())
                call.output = weakref.ref(out.untyped_storage())
                if out.requires_grad:
                    out.register_hook(lambda grad: self.mark(Phase.backward(index)))
            if index == len(self.blocks) - 1:
                self._previous = (None, None)
                self.mark(Phase.post(Direction.FORWARD))
            else:
                self._previous = (out, self._previous[1])
                self.mark(Phase.gap(Direction.FORWARD, index))
            self._gap_state = self._state()

        return hook
