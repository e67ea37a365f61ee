"""The time of a compiled step's graphs as inductor runs them: each partitioned forward and
backward graph priced kernel by kernel on the target's roofline, so that what the
partitioner does with a plan (which values it saves, which it recomputes, and where a
recomputed pointwise op fuses into a backward kernel) shows in the plan's predicted time.

Note [pricing the partition]
    The chain prices a compiled plan by its options: every op a region rebuilds costs its time
    in the step. But the unchecked compiled step is not the eager one: the min-cut partitioner
    already recomputes cheap pointwise values in backward instead of saving them, and inductor
    runs a recomputed pointwise op inside the backward kernel that reads it, while a saved value
    costs a write in forward and a read in backward. So each graph the fake run's partition made
    is priced as inductor runs it: the kernels its scheduler made of the graph (``graph_memory``
    lowers it anyway, for its memory), each library call at the FLOPs of the nodes it came from
    (and, on the CPU, the time of the bytes it moves from memory rather than the cache: Note
    [recompute reads from cache] in ``kernelcost``) and each kernel at the bytes inductor counts
    for its buffers, on the device's own roofline (the chain halves a pointwise op's traffic for
    fusion it cannot see, Note [pricing a compiled step], which here would count fusion twice).
    A plan's predicted recompute time is its graphs' time less the unchecked step's, which can
    be below zero, and only graphs the measured step runs count (transformers' loss recompiles
    the step at its second call); its overhead is that difference over the unchecked step, whose
    graphs are priced the same way and whose optimizer step, run eagerly outside them, from the
    profile (Note [the optimizer step runs from cache] in ``ckptplan.profiling.costs``). Where
    inductor cannot lower a graph here, ``kernels`` groups its nodes as inductor's scheduler
    would, but inlines a pointwise value into every reader where inductor writes out one that
    several read (its ``realize_reads_threshold``).

    ``benchmarks/compile.py`` (one CPU thread, 64 back-to-back pairs against the compiled
    unchecked step, one model at a time on a quiet machine, freed memory kept by malloc,
    graphs priced on the reference CPU): HF Llama (12x256, 256 tokens) plans at compile's
    0.3/0.5/0.7 points are predicted +9.5/+3.2/+1.1% and measured +12.5/+5.6/+2.2% (medians'
    95% intervals 11.7-13.4, 4.6-6.5, 1.8-3.1: the price is 1-3 points low); HF ViT (12x192,
    384px) plans are predicted -1.0/-0.7/-0.2% and measured -0.9/-0.4/-1.7% (intervals
    -1.3..-0.4, -1.7..+0.5, -2.5..-0.9). Three quiet runs of the same plans measured Llama's
    0.5 point at +5.6/+4.3/+5.6% and ViT's 0.7 at -3.0/-1.5/-1.7%. With another job on the
    second core the same Llama plans measured +7.6/+3.2/-0.8% and +15.0/+6.3/+2.2%. Where the
    price misses, part by part, ``benchmarks/kernel_prices.py --plans`` shows: a plan's
    forward, writing less into fresh buffers, is priced 5-8 ms faster than the unchecked
    step's where it ran 2-5 ms faster, and its recomputed pointwise kernels in backward are
    priced over their time (Note [a fresh buffer is read before it is written] in
    ``kernelcost``). Node by node, with every value a kernel of its own, ViT read -7%; without
    the cache, Llama's read 40% high. The search compares the plans it confirms by this price
    (Note [ranking compiled plans] in ``ckptplan.planning.search``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from ckptplan.devices import Device, OpKind, op_kind
from ckptplan.profiling.costs import op_flops
from ckptplan.stepping.fusion import fused_away, in_fused_kernel, is_view
from ckptplan.stepping.kernelcost import Kernel, kernel_seconds


def graph_seconds(
    graph: torch.fx.GraphModule, device: Device, lowered: Sequence[Kernel] | None = None
) -> float:
    """The seconds ``graph``'s kernels take on ``device`` (Note [pricing the partition]): the
    kernels inductor's scheduler made of it (``lowered``, ``scheduled_kernels``) where it
    could lower the graph here, else those ``kernels`` infers from the graph.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> from ckptplan.devices import get_device
    >>> def step(x, w):
    ...     return torch.relu(x @ w).sum()
    >>> graph = make_fx(step, tracing_mode="fake")(torch.ones(64, 64), torch.ones(64, 64))
    >>> cpu = get_device("cpu", compiled=True)
    >>> graph_seconds(graph, cpu) > cpu.op_time("matmul", 2 * 64**3, 0, half=False)
    True
    """
    kernels = inferred_kernels(graph.graph) if lowered is None else lowered
    return sum(kernel_seconds(kernels, device))


def scheduled_kernels(nodes: Sequence[Any]) -> tuple[Kernel, ...]:
    """The kernels of inductor's scheduler ``nodes`` (a graph lowered, fused and ordered):
    a library call's FLOPs are those of the graph nodes it came from, and each kernel moves
    the bytes inductor counts for its buffers (``get_read_write_buffers_sizes``)."""
    from torch._inductor.ir import MultiOutput
    from torch._inductor.scheduler import ExternKernelSchedulerNode, NopKernelSchedulerNode
    from torch._inductor.virtualized import V

    # What the graph hands on (outputs) or changes in place (its inputs) outlives it.
    outlive = set(V.graph.get_output_names()) | set(V.graph.graph_inputs)
    found = []
    parts: dict[str, str] = {}  # a library call's output taken apart -> the call's result
    for node in nodes:
        # A library call's outputs taken apart (``MultiOutput``) are views of its result.
        if isinstance(node.node, MultiOutput):
            parts[node.get_name()] = node.node.inputs[0].get_name()
        if isinstance(node, NopKernelSchedulerNode) or isinstance(node.node, MultiOutput):
            continue
        kind: OpKind = "memory"
        flops = 0.0
        if isinstance(node, ExternKernelSchedulerNode):
            calls = [c for c in map(aten_call, node.node.origins) if c is not None]
            kinds = [op_kind(str(c.op)) for c in calls]
            kind = next((k for k in kinds if k != "memory"), "memory")
            flops = sum(c.flops() for c in calls)
        dtypes = [buffer.node.maybe_get_dtype() for buffer in node.get_outputs()]
        half = any(d in (torch.float16, torch.bfloat16) for d in dtypes)
        reads = node.get_read_write_buffer_accesses(include_reads=True, include_writes=False)
        writes = node.get_read_write_buffer_accesses(include_reads=False, include_writes=True)
        moved = int(node.get_read_write_buffers_sizes())
        kept = frozenset(name for name in writes if name in outlive)
        read = tuple((parts.get(name, name), size) for name, size in reads.items())
        found.append(Kernel(kind, flops, moved, half, read, tuple(writes.items()), kept))
    return tuple(found)


def inferred_kernels(graph: torch.fx.Graph) -> list[Kernel]:
    """``graph``'s kernels as ``kernels`` groups its nodes, where inductor did not lower it."""
    away = fused_away(graph)
    outputs = {_base(n) for n in graph.find_nodes(op="output")[0].all_input_nodes}
    found = []
    for kernel in kernels(graph, away):
        half = any(t.dtype in (torch.float16, torch.bfloat16) for t in _outputs(kernel))
        writes = tuple((n.name, _bytes(_value(n))) for n in kernel)
        reads = tuple((_base(n).name, _bytes(_value(n))) for n in _kernel_inputs(kernel, away))
        calls = [c for c in map(aten_call, kernel) if c is not None]
        kind = op_kind(str(calls[0].op)) if len(kernel) == 1 and calls else "memory"
        flops = sum(c.flops() for c in calls)
        moved = sum(size for _, size in writes + reads)
        kept = frozenset(n.name for n in kernel if n in outputs)
        found.append(Kernel(kind, flops, moved, half, reads, writes, kept))
    return found


def kernels(graph: torch.fx.Graph, away: set[torch.fx.Node]) -> list[list[torch.fx.Node]]:
    """The kernels inductor runs ``graph`` in (Note [one kernel per fused group]): each library
    call alone, and the pointwise ops and reductions that write their values grouped, a value
    joining its reader's kernel where no library call runs between them. Views and the
    ``away`` nodes, inlined into their readers, belong to none.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def step(x, w):
    ...     y = torch.relu(x)
    ...     return y @ w, y.sum() * 2
    >>> graph = make_fx(step, tracing_mode="fake")(torch.ones(4, 4), torch.ones(4, 4)).graph
    >>> [[str(n.target) for n in k] for k in kernels(graph, fused_away(graph))]
    [['aten.relu.default', 'aten.sum.default', 'aten.mul.Tensor'], ['aten.mm.default']]
    """
    written = [
        n for n in graph.nodes if aten_call(n) is not None and not is_view(n) and n not in away
    ]
    library = {n: i for i, n in enumerate(n for n in written if not in_fused_kernel(n))}
    above = _library_reach(graph.nodes, library, lambda n: n.all_input_nodes)
    below = _library_reach(reversed(graph.nodes), library, lambda n: list(n.users))
    group = {n: n for n in written}

    def root(node: torch.fx.Node) -> torch.fx.Node:
        while group[node] is not node:
            group[node] = group[group[node]]
            node = group[node]
        return node

    for reader in written:
        if reader in library:
            continue
        for value in _kernel_inputs([reader], away):
            value = _base(value)
            if value in group and value not in library and not below[value] & above[reader]:
                group[root(value)] = root(reader)
    members: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in written:
        members.setdefault(root(node), []).append(node)
    return list(members.values())


def _library_reach(
    nodes: Any, library: dict[torch.fx.Node, int], neighbours: Any
) -> dict[torch.fx.Node, int]:
    """Per node, the library calls (bits of ``library``'s numbers) it reaches through
    ``neighbours`` (inputs: those it depends on; users: those that depend on it), itself
    included."""
    reach: dict[torch.fx.Node, int] = {}
    for node in nodes:
        bits = 1 << library[node] if node in library else 0
        for other in neighbours(node):
            bits |= reach.get(other, 0)
        reach[node] = bits
    return reach


# Note [one kernel per fused group]
#     Inductor writes a pointwise op's value to memory when a library kernel, the graph's
#     output or the backward graph reads it; but the kernel that computes it also runs the
#     pointwise ops and reductions that read it, in the same loop, where no library call
#     must run in between. So a chain of pointwise ops whose values are all saved for backward
#     (a forward graph's norms and activations) is one kernel that reads its inputs once and
#     writes each saved value once, not one kernel per value each reading the last back (as
#     ``tests/test_graphcost.py`` checks against inductor's own scheduler). A value feeds its
#     reader's kernel from registers unless a library call lies between (a residual sum read
#     again after the MLP: the matmuls need it first), which the library calls each node
#     reaches above and below tell. This is the fallback: a graph inductor lowers is priced
#     by its scheduler's kernels (Note [pricing the partition]).


@dataclass(frozen=True)
class AtenCall:
    """An aten op a graph node runs, with the values of its arguments and its output."""

    op: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out: Any

    def flops(self) -> float:
        return op_flops(self.op, self.args, self.kwargs, self.out)


def aten_call(node: torch.fx.Node) -> AtenCall | None:
    """The aten op ``node`` runs, None for a placeholder, an output or a getitem; for a
    wrapper that replays a random op's numbers, the op it wraps (Note [attention in a
    checkpointed region])."""
    if node.op != "call_function":
        return None
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), _value)
    out = _value(node)
    if hasattr(node.target, "_schema"):
        return AtenCall(node.target, args, kwargs, out)
    if not isinstance(node.target, torch._ops.HigherOrderOperator):
        return None
    wrapper = node.target.name()
    if wrapper == "run_and_save_rng_state":  # (op, *args) -> (rng state, out)
        call = AtenCall(args[0], args[1:], kwargs, out[1] if isinstance(out, tuple) else None)
    elif wrapper == "run_with_rng_state":  # (rng state, op, *args) -> out
        call = AtenCall(args[1], args[2:], kwargs, out)
    elif wrapper == "graphsafe_run_with_rng_state":  # (op, *args, rng_state=...) -> out
        rest = {k: v for k, v in kwargs.items() if k != "rng_state"}
        call = AtenCall(args[0], args[1:], rest, out)
    else:
        return None
    return call if hasattr(call.op, "_schema") else None


# Note [attention in a checkpointed region]
#     Inside a checkpointed region the partitioner wraps every op tagged random in
#     ``run_and_save_rng_state`` in forward and ``run_with_rng_state`` where backward
#     recomputes it, so that both draw the same numbers; attention is tagged random for its
#     dropout, even at probability 0. Inductor calls the wrapper, whose origin node is no
#     aten op, so the wrapped op is priced in its place: priced by the wrapper's bytes alone,
#     HF ViT's plan of five checkpointed layers read +3.3% and ran +8.8%.


def _outputs(kernel: list[torch.fx.Node]) -> list[torch.Tensor]:
    return [t for node in kernel for t in _tensors(_value(node))]


def _kernel_inputs(kernel: list[torch.fx.Node], away: set[torch.fx.Node]) -> set[torch.fx.Node]:
    """The values ``kernel`` reads from memory, as the nodes (views among them) it reads."""
    own = set(kernel)
    read: set[torch.fx.Node] = set()
    inlined: set[torch.fx.Node] = set()
    stack = [arg for node in kernel for arg in node.all_input_nodes]
    while stack:
        arg = stack.pop()
        base = _base(arg)
        if base in own:
            continue
        if base not in away:
            read.add(arg)
        elif base not in inlined:
            inlined.add(base)
            stack.extend(base.all_input_nodes)
    return read


def _value(node: torch.fx.Node) -> Any:
    return node.meta.get("val")


def _base(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose value ``node`` views (itself if it is no view)."""
    while is_view(node) and node.all_input_nodes:
        node = node.all_input_nodes[0]
    return node


def _tensors(value: Any) -> list[torch.Tensor]:
    leaves = torch.utils._pytree.tree_leaves(value)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _bytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(value))
