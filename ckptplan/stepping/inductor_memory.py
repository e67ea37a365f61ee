"""A compiled graph's memory as inductor's own code holds it, read without compiling a kernel.

Inductor does not run a graph op by op: its scheduler fuses pointwise ops into kernels (the
recomputed residual adds of several checkpointed blocks become one kernel at the first use,
which writes every block's residual out at once), reorders kernels for peak memory, and its
wrapper code keeps a dead buffer until a later buffer of the same size takes it over. So eager
kernels run in graph order, however carefully their fused values are left uncounted, miss what
the compiled graph holds: on a ViT whose four blocks were one selective region the fake run
was 9% under the allocator, and 3.5% under for four one-block regions.

``graph_memory`` runs inductor itself on the graph (on fake tensors: its lowering, scheduler
and the wrapper's memory planning) and stops where the wrapper's allocation and free lines are
final, before any kernel is compiled; ``GraphMemory`` replays those lines storage by storage.
On that ViT the step's peak then matched the allocator's to 4 bytes.

Example:
    >>> events = GraphMemory(inputs=(100,), events=(50, -100, 80, -50), freeable=(0,))
    >>> events.peak(block=1)   # the input and the first buffer, then the second buffer alone
    150
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.fx

from ckptplan.patching import patched, patched_config
from ckptplan.profiling.memtrack import storage_key
from ckptplan.stepping.graphcost import scheduled_kernels
from ckptplan.stepping.kernelcost import Kernel


@dataclass(frozen=True)
class GraphMemory:
    """The storages a compiled graph allocates and frees, in the order its code does."""

    inputs: tuple[int, ...]
    """Bytes of each distinct storage among the graph's freeable inputs (live at the start)."""
    events: tuple[int, ...]
    """Bytes allocated (positive) or freed (negative) by the graph's code, in order."""
    freeable: tuple[int, ...]
    """Positions of the graph's arguments the graph may free: the forward's saved tensors and
    the incoming gradients, not parameters or the batch (``primals_*``), which the caller holds."""
    library_calls: dict[str, LibraryCall] = field(default_factory=dict)
    """Graph node -> the library kernel inductor calls for it: where the kernel's own buffers
    (``profiling.workspace``) come on top of the graph's."""
    kernels: tuple[Kernel, ...] | None = None
    """The kernels inductor's scheduler made of the graph, in order: what the graph's time is
    priced by (``stepping.graphcost``); None where they could not be read."""

    def peak(self, block: int) -> int:
        """The most bytes live at once, each storage rounded up to ``block`` bytes."""
        return max(self._timeline(block))

    def live_before(self, node: str, block: int) -> int | None:
        """Bytes live as ``node``'s library kernel starts, less the outputs handed to it (the
        kernel's measured peak includes them); None if ``node`` is no library call."""
        call = self.library_calls.get(node)
        if call is None:
            return None
        return list(self._timeline(block))[call.at] - _rounded(call.written, block)

    def _timeline(self, block: int) -> Iterator[int]:
        live = sum(_rounded(size, block) for size in self.inputs)
        yield live
        for size in self.events:
            live += _rounded(size, block) if size > 0 else -_rounded(-size, block)
            yield live


@dataclass(frozen=True)
class LibraryCall:
    """A library kernel (matmul, convolution, a fallback op) in a compiled graph's code."""

    at: int
    """Events of the graph's code before the call."""
    written: int
    """Bytes of the outputs the kernel is handed (its ``out=``), allocated before the call."""


def _rounded(size: int, block: int) -> int:
    return -(-size // block) * block


class _Planned(Exception):
    """Raised once the wrapper's memory lines are planned: nothing after them is needed."""


def graph_memory(
    graph: torch.fx.GraphModule, example_inputs: Sequence[Any], is_backward: bool
) -> GraphMemory | None:
    """``graph``'s memory as inductor would compile it; None where inductor cannot lower it
    here (the step is then counted op by op, as eager kernels run it)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.virtualized import V

    names = [n.name for n in graph.graph.nodes if n.op == "placeholder"]
    planned: list[GraphMemory] = []
    plan_reuse = PythonWrapperCodegen.memory_plan_reuse

    def read_lines(wrapper: PythonWrapperCodegen) -> None:
        plan_reuse(wrapper)
        planned.append(_replayed(wrapper.lines, names, example_inputs))
        # The memory stands without the kernels: a scheduler node this torch lays out
        # otherwise than ``scheduled_kernels`` reads leaves the graph priced from its nodes.
        with contextlib.suppress(Exception):
            planned[0] = replace(planned[0], kernels=scheduled_kernels(V.graph.scheduler.nodes))
        raise _Planned

    # Lowering mutates the graph (post-grad passes); the copy keeps the caller's graph as the
    # partitioner made it, to run with eager kernels.
    lowered = copy.deepcopy(graph)
    with (
        patched(PythonWrapperCodegen, "memory_plan_reuse", read_lines),
        patched_config(inductor_config, fx_graph_cache=False),
        # _Planned, however inductor wrapped it, or a failure to lower: ``planned`` says which.
        contextlib.suppress(Exception),
    ):
        compile_fx_inner(lowered, example_inputs, is_backward=is_backward)
    return planned[0] if planned else None


def _replayed(lines: Sequence[Any], names: Sequence[str], inputs: Sequence[Any]) -> GraphMemory:
    """The wrapper's lines as allocation and free events of storages: a name holds a storage
    (a reused buffer, a reinterpreted view and a graph input's aliases share one), and a storage
    is freed when its last name is."""
    from torch._inductor import ir
    from torch._inductor.codegen import wrapper as lines_of
    from torch._inductor.utils import get_dtype_size
    from torch._inductor.virtualized import V
    from torch.fx.experimental.symbolic_shapes import optimization_hint

    storages = _Storages()
    sizes, freeable, seen = [], [], {}
    library_calls: dict[str, LibraryCall] = {}
    for position, (name, value) in enumerate(zip(names, inputs, strict=True)):
        if not isinstance(value, torch.Tensor):
            continue
        key = storage_key(value)
        if key in seen:
            storages.alias(name, seen[key])
            continue
        seen[key] = name
        held = not name.startswith("primals")
        nbytes = optimization_hint(value.untyped_storage().nbytes()) if held else 0
        storages.new(name, nbytes)
        if held:
            sizes.append(nbytes)
            freeable.append(position)
    storages.events.clear()

    def size(node: Any) -> int:
        length = V.graph.sizevars.optimization_hint(
            V.graph.get_allocation_storage_size(node), fallback=0
        )
        return int(length) * get_dtype_size(node.get_dtype())

    for line in lines:
        if isinstance(line, lines_of.AllocateLine):
            storages.new(line.node.get_name(), size(line.node))
        elif isinstance(line, (lines_of.ReuseLine, lines_of.ReinterpretLine)):
            storages.alias(line.reused_as.get_name(), line.node.get_name())
            if isinstance(line, lines_of.ReuseLine) and line.delete_old:
                storages.drop(line.node.get_name())
        elif isinstance(line, lines_of.FreeLine) or (
            isinstance(line, lines_of.FreeIfNotReusedLine) and not line.is_reused
        ):
            storages.drop(line.node.get_name())
        elif isinstance(line, lines_of.ExternKernelOutLine):
            call = LibraryCall(len(storages.events), size(line.node))
            library_calls.update(dict.fromkeys(_origins(line.node), call))
        elif isinstance(line, lines_of.ExternKernelAllocLine):
            call = LibraryCall(len(storages.events), 0)
            library_calls.update(dict.fromkeys(_origins(line.node), call))
            layout = line.node.layout
            if not isinstance(layout, ir.NoneLayout):
                multi = isinstance(layout, ir.MultiOutputLayout)  # its outputs are taken apart
                storages.new(line.node.get_name(), 0 if multi else size(line.node))
        elif isinstance(line, lines_of.MultiOutputLine):
            storages.new(line.result_name, size(V.graph.get_buffer(line.result_name)))
        elif isinstance(line, str) and line.startswith("del "):
            for name in line.removeprefix("del ").split(","):
                storages.drop(name.strip())
    return GraphMemory(tuple(sizes), tuple(storages.events), tuple(freeable), library_calls)


def _origins(node: Any) -> list[str]:
    return [origin.name for origin in getattr(node, "origins", ())]


class _Storages:
    """Names of the wrapper's code and the storages they hold, with the events that makes."""

    def __init__(self) -> None:
        self.ids = itertools.count()
        self.held: dict[str, int] = {}
        self.names: dict[int, set[str]] = {}
        self.sizes: dict[int, int] = {}
        self.events: list[int] = []

    def new(self, name: str, size: int) -> None:
        self.drop(name)
        storage = next(self.ids)
        self.held[name], self.names[storage], self.sizes[storage] = storage, {name}, size
        self.events.append(size)

    def alias(self, name: str, of: str) -> None:
        self.drop(name)
        if of in self.held:
            self.held[name] = self.held[of]
            self.names[self.held[of]].add(name)

    def drop(self, name: str) -> None:
        storage = self.held.pop(name, None)
        if storage is None:
            return
        self.names[storage].discard(name)
        if not self.names[storage]:
            del self.names[storage]
            self.events.append(-self.sizes.pop(storage))
