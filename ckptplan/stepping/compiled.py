"""A ``torch.compile``d training step as ckptplan plans and checks it.

Under ``torch.compile`` what a step keeps for backward is not what autograd saves in eager
mode: AOTAutograd traces forward and backward into one joint graph and its min-cut partitioner
chooses the tensors the forward graph hands to the backward graph. Inside a checkpoint region
the partitioner follows the region's tags (a selective policy's ``MUST_SAVE`` ops are saved,
everything else is recomputed in backward, random ops replayed from a saved RNG state), and
outside regions it makes its own choice. So a compiled plan's peak is taken from that partition,
run on fake tensors: ``partitioning_backend`` is inductor's own decompositions and partitioner
with eager kernels in place of inductor's compiled code, which needs a compiler, real tensors
and minutes; what each graph holds is read from inductor's lowering (``inductor_memory``).
``Partition`` records what was saved (a test holds real inductor to the same partition).

Example:
    >>> log = Partition()
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    >>> model = CompiledModel(net, partitioning_backend(log))
    >>> model(torch.randn(2, 4)).sum().backward()
    >>> log.graphs, log.saved_bytes   # tanh's output: its own gradient and the last weight's
    (1, 32)
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from ckptplan.patching import patched_config
from ckptplan.profiling.memtrack import CompiledStepTracker, compiled_step_tracker, fused
from ckptplan.stepping.fusion import fused_away
from ckptplan.stepping.inductor_memory import GraphMemory, graph_memory


@dataclass
class Partition:
    """What the partitioner handed from forward to backward, per compiled graph, in order.

    Each saved tensor is ``(shape, dtype)``; the forward graph's own inputs (parameters, the
    batch, region inputs outside the graph) are left out: they are live anyway.
    """

    saved: list[list[tuple[tuple[int, ...], str]]] = field(default_factory=list)
    compiled_graphs: int = 0
    """Forward graphs compiled: one per dynamo graph, more after a recompilation."""
    graph_breaks: int = 0
    """Graph breaks while compiling (``stepping.graphbreaks``): where dynamo split a frame's graph,
    and frames it ran eagerly whole after a break it could not resume from (in a loop)."""
    lowered_graphs: int = 0
    """Graphs, forward and backward, whose memory was read from inductor's lowering
    (``inductor_memory``); the others were counted op by op, as eager kernels run them."""
    seconds: float = 0.0
    """The time on the target (``stepping.graphcost``) of the forward and backward graphs the
    measured step ran: not of those compiled before a recompilation, which it no longer runs
    (transformers' loss sets its config at the first step, so the second recompiles)."""

    @property
    def graphs(self) -> int:
        return len(self.saved)

    @property
    def saved_bytes(self) -> int:
        return sum(_bytes(shape, dtype) for graph in self.saved for shape, dtype in graph)

    def ran(self, seconds: float) -> None:
        """A graph of ``seconds`` ran in the measured step."""
        self.seconds += seconds

    def note_backward(self, graph: torch.fx.GraphModule) -> None:
        self.saved.append(list(saved_tensors(graph)))

    def to_json(self) -> dict[str, Any]:
        return {
            "graphs": self.graphs,
            "compiled_graphs": self.compiled_graphs,
            "graph_breaks": self.graph_breaks,
            "lowered_graphs": self.lowered_graphs,
            "seconds": self.seconds,
            "saved_bytes": self.saved_bytes,
            "saved": [[[list(shape), dtype] for shape, dtype in g] for g in self.saved],
        }


def saved_tensors(backward: torch.fx.GraphModule) -> Iterator[tuple[tuple[int, ...], str]]:
    """The activations a backward graph receives from its forward graph: its placeholders but
    the incoming gradients (``tangents_*``) and the forward graph's own inputs (``primals_*``)."""
    for node in backward.graph.nodes:
        if node.op != "placeholder" or node.name.startswith(("tangents", "primals")):
            continue
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            yield tuple(int(s) for s in value.shape), str(value.dtype).removeprefix("torch.")


def _bytes(shape: tuple[int, ...], dtype: str) -> int:
    return getattr(torch, dtype).itemsize * int(torch.Size(shape).numel())


def partitioning_backend(
    log: Partition, price: Callable[..., float] | None = None
) -> Callable[..., Any]:
    """A ``torch.compile`` backend that partitions as inductor does and runs eager kernels;
    ``price`` gives each graph's seconds from the graph and the kernels inductor's lowering
    made of it (None where it could not lower it), added up in the log for each run in the
    measured step."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch import config as functorch_config
    from torch._guards import detect_fake_mode
    from torch._inductor.compile_fx import partition_fn, select_decomp_table
    from torch._inductor.virtualized import V

    def lowered(graph: torch.fx.GraphModule, example_inputs: Any, is_backward: bool) -> Any:
        memory = graph_memory(graph, example_inputs, is_backward)
        seconds = price(graph, lowered=memory and memory.kernels) if price else 0.0
        log.lowered_graphs += memory is not None
        return _freeing(graph, memory, functools.partial(log.ran, seconds))

    def forward(graph: torch.fx.GraphModule, example_inputs: Any) -> Any:
        log.compiled_graphs += 1
        return lowered(graph, example_inputs, is_backward=False)

    def backward(graph: torch.fx.GraphModule, example_inputs: Any) -> Any:
        log.note_backward(graph)
        return lowered(graph, example_inputs, is_backward=True)

    def partition(graph: torch.fx.GraphModule, inputs: Any, **kwargs: Any) -> Any:
        # Inductor's own: its joint-graph passes (attention patterns fused back into one op,
        # among others), then the min-cut partitioner; the passes read the fake mode from V.
        with V.set_fake_mode(detect_fake_mode(inputs)):
            return partition_fn(graph, inputs, **kwargs)

    compile_step = aot_autograd(
        fw_compiler=forward,
        bw_compiler=backward,
        decompositions=select_decomp_table,  # read when compiling: it follows fallback_random
        partition_fn=partition,
    )

    def backend(graph: torch.fx.GraphModule, example_inputs: Any) -> Any:
        # A hit in AOTAutograd's cache would skip the partition, and with it the record.
        with patched_config(functorch_config, enable_autograd_cache=False):
            return compile_step(graph, example_inputs)

    return backend


def _freeing(
    graph: torch.fx.GraphModule, memory: GraphMemory | None, ran: Callable[[], None]
) -> Callable[[list[Any]], Any]:
    """``graph`` run op by op, each value (the saved tensors among them) dropped after its last
    use, as inductor's code does: the boxed calling convention hands over the argument list,
    which the interpreter clears. A plain ``graph.forward`` would hold every saved tensor until
    the backward graph ends.

    What the graph holds while it runs is ``memory``, inductor's own memory lines replayed
    (``inductor_memory``): the step's tracker is told its peak above what the caller holds,
    with the buffers of the library kernels the graph calls on top, and counts the graph's
    outputs once it returns. Where inductor could not lower the graph here, the
    tracker counts the eager kernels' values instead, less those inductor fuses away. Each run
    in the measured step (the tracker's) is told to ``ran``."""
    interpreter = _Fusing(graph)

    def run(args: list[Any]) -> Any:
        tracker = compiled_step_tracker()
        if tracker is not None:
            ran()
        try:
            if memory is None or tracker is None:
                return interpreter.boxed_run(args)
            held = tracker.live - tracker.tracked_bytes(args[i] for i in memory.freeable)
            interpreter.noting = _Noting(tracker, held, memory)
            with fused():
                out = interpreter.boxed_run(args)
            tracker.peak_at(held + memory.peak(tracker.block))
            for leaf in torch.utils._pytree.tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    tracker.count(leaf)
            return out
        finally:
            interpreter.noting = None
            # The interpreter keeps the output tuple in its environment until its next run:
            # the forward graph's outputs are the saved tensors, which would then outlive
            # their last use in backward (the fake run over-counted compiled peaks by up to 43%).
            interpreter.env.clear()

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


@dataclass(frozen=True)
class _Noting:
    """A compiled graph's run that reports inductor's memory to the step's tracker."""

    tracker: CompiledStepTracker
    held: int
    """Bytes the tracker counts that the graph does not free: its caller's."""
    memory: GraphMemory

    def library_call(self, op: Any, args: Any, kwargs: Any, node: str) -> None:
        """The moment ``node``'s library kernel peaks: what inductor's code holds as it starts,
        and the kernel's own buffers on top (``profiling.workspace``)."""
        if node not in self.memory.library_calls:
            return
        inside = self.tracker.workspace_of(op, args, kwargs)
        before = self.memory.live_before(node, self.tracker.block)
        if inside and before is not None:
            self.tracker.peak_at(self.held + before + inside)


class _Fusing(torch.fx.Interpreter):
    """Runs a graph with eager kernels as inductor lays it out: the values of ``fused_away``
    nodes uncounted, and the channels-last copies inductor saves for convolutions counted."""

    def __init__(self, graph: torch.fx.GraphModule) -> None:
        from torch._inductor.graph import GraphLowering

        super().__init__(graph)
        self.fused = fused_away(graph.graph)
        self.channels_last = GraphLowering.decide_layout_opt(graph, is_inference=False)
        self.copies: dict[int, torch.Tensor] = {}
        """id of a graph input -> its channels-last copy, which the graph outputs instead."""
        self.noting: _Noting | None = None

    def run_node(self, n: torch.fx.Node) -> Any:
        if self.channels_last and n.target is torch.ops.aten.convolution.default:
            self._copy_channels_last(n.args[:2])
        if n.op == "output" and self.copies:
            copies, self.copies = self.copies, {}
            out = super().run_node(n)
            return torch.utils._pytree.tree_map(lambda v: copies.get(id(v), v), out)
        with self._traced_layouts(n):
            if self.noting is not None and n.op == "call_function":
                self.noting.library_call(n.target, *self.fetch_args_kwargs_from_env(n), n.name)
            if n not in self.fused:
                return super().run_node(n)
            with fused():
                return super().run_node(n)

    @contextmanager
    def _traced_layouts(self, n: torch.fx.Node) -> Iterator[None]:
        """A backward graph's op given its saved inputs in the traced layout: an uncounted copy
        of a channels-last copy, as inductor's kernel would index the saved buffer in place
        (eager kernels would propagate the layout, and views of the result fail)."""
        if n.op != "call_function":
            yield
            return
        swapped = {}
        for arg in n.all_input_nodes:
            value = self.env.get(arg)
            traced = arg.meta.get("val")
            if (
                arg.op == "placeholder"
                and isinstance(value, torch.Tensor)
                and isinstance(traced, torch.Tensor)
                and value.stride() != traced.stride()
            ):
                swapped[arg] = value
                with fused():
                    self.env[arg] = torch.empty_strided(
                        value.shape, traced.stride(), dtype=value.dtype, device=value.device
                    ).copy_(value)
        try:
            yield
        finally:
            self.env.update(swapped)

    def _copy_channels_last(self, args: tuple[Any, ...]) -> None:
        """Inductor's layout optimisation (Note [channels-last copies under inductor])."""
        for arg in args:
            if not (isinstance(arg, torch.fx.Node) and arg.op == "placeholder"):
                continue
            value = self.env.get(arg)
            if not isinstance(value, torch.Tensor) or value.dim() not in (4, 5):
                continue
            layout = torch.channels_last if value.dim() == 4 else torch.channels_last_3d
            if id(value) not in self.copies and not value.is_contiguous(memory_format=layout):
                self.copies[id(value)] = value.contiguous(memory_format=layout)


# Note [channels-last copies under inductor]
#     When a graph has convolutions, inductor on the CPU (and on a GPU by its heuristics,
#     ``GraphLowering.decide_layout_opt``) runs them channels-last. Values computed in the
#     graph are written channels-last by their producers, at no extra memory; but a graph
#     input (the batch, a weight) has a fixed layout, so it is copied, and the tensors saved
#     for backward are then the copies. A ViT's patch embedding thus keeps a channels-last copy
#     of the image batch and of its weight until backward (6.6 MiB on the ViT sample): without
#     them the fake run was 3.7% under the allocator. The fake run makes those copies and
#     hands them to backward in place of the inputs, while its own convolutions keep the
#     traced layouts, and every op of backward reads a copy in the traced layout, uncounted
#     (an eager kernel given channels-last inputs would propagate the layout to values that
#     later views expect contiguous; inductor's kernels index the saved buffer as it is).


def inductor_backend(log: Partition) -> Callable[..., Any]:
    """Inductor itself, its backward graphs' saved tensors written to ``log``."""
    from torch._functorch import config as functorch_config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    def inner(graph: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        if kwargs.get("is_backward"):
            log.note_backward(graph)
        else:
            log.compiled_graphs += 1
        return compile_fx_inner(graph, example_inputs, **kwargs)

    def backend(graph: torch.fx.GraphModule, example_inputs: Any) -> Any:
        # A hit in AOTAutograd's cache would skip the partition, and with it the record.
        with patched_config(functorch_config, enable_autograd_cache=False):
            return compile_fx(graph, example_inputs, inner_compile=inner)

    return backend


class CompiledModel(torch.nn.Module):
    """``torch.compile(model, backend=backend)`` whose parameters keep the model's own names
    (``torch.compile`` prefixes them with ``_orig_mod.``), so gradients compare name by name.

    Note [compiling without touching the caller's caches]: dynamo caches compiled code on code
    objects, and a model's ``forward`` is shared by every instance of its class, the caller's
    own compiled model among them. Each entry compiled here is a new backend, so on ``forward``
    it would count against the caller's recompile limit (past which dynamo runs the model
    eagerly for good), and clearing them with ``torch._dynamo.reset()`` would drop the caller's
    compiled code as well (it then recompiles outside the settings it was compiled under). So
    the model is called from a function with a code object of its own, which dynamo traces
    from and which dies with this module, its cache with it; ``isolate_recompiles`` keeps the
    entries of frames past a graph break out of the caller's recompile count.
    """

    def __init__(self, model: torch.nn.Module, backend: Callable[..., Any] | str) -> None:
        super().__init__()
        self.model = model
        self.compiled = torch.compile(
            _private_call(model), backend=backend, isolate_recompiles=True
        )

    def named_parameters(self, *args: Any, **kwargs: Any) -> Any:
        yield from self.model.named_parameters(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled(*args, **kwargs)


def _private_call(model: torch.nn.Module) -> Callable[..., Any]:
    """A function that calls ``model``, on a code object no other function shares."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return model(*args, **kwargs)

    return types.FunctionType(
        call.__code__.replace(), call.__globals__, call.__name__, None, call.__closure__
    )
