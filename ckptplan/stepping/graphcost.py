"""The time of a compiled step's graphs as inductor runs them: each partitioned forward and
backward graph priced kernel by kernel on the target's roofline, so that what the
partitioner does with a plan (which values it saves, which it recomputes, and where a
recomputed pointwise op fuses into a backward kernel) shows in the plan's predicted time.

Note [pricing the partition]
    The chain prices a compiled plan by its options: every op a region rebuilds costs its
    time in the step. But the unchecked compiled step is not the eager one: the min-cut
    partitioner already recomputes cheap pointwise values in backward instead of saving them,
    and a recomputed pointwise op that inductor inlines into the backward kernel reading it
    costs no memory traffic of its own, while a saved value costs a write in forward and a
    read in backward. So on Hugging Face Llama (12x256, 256 tokens) the chain predicted
    +14.0/+6.5/+3.8% over the compiled unchecked step where paired timings measured
    +12.1/+4.7/+1.7%: about two points too high at every budget, the recompute the unchecked
    step pays as well. Here each graph the fake run's partition made is priced as its kernels
    run: a node's FLOPs on its class's roofline, and as traffic, for a node that is written
    out, its output and the inputs its kernel reads from memory, its own and those of the
    ``fused_away`` nodes it inlines, each once; views are free. The roofline is the device's
    own: the chain halves a pointwise op's traffic for fusion it cannot see (Note [pricing a
    compiled step]), which here would count fusion twice and price a saved value at half its
    cost. So priced, the unchecked compiled step of HF ViT (12x192, 384px) is 0.533 s where
    one thread measured 0.587 s, and HF Llama's 0.720 s where it measured 0.788 s; with the
    chain's discount they were 0.434 and 0.635 s. A plan's predicted recompute time is its
    graphs' time less the unchecked step's, which can be below zero: a plan may run faster
    than the step it checkpoints, as compile's own budget did on ViT (x0.84 at 0.7). Its
    overhead is that difference over the unchecked step's graphs, one instrument for both,
    and only graphs the measured step runs count: transformers' loss recompiles the step at
    its second call, and the first graphs, priced as well, doubled ViT's figure. The
    search still compares plans by the chain's prices: choosing by these, it took whole-block
    regions for Llama's 0.3 point, predicted +10.4%, measured +15.1%, where the chain's
    selective plan measured +12.1%: whole-block recompute is priced low here, for reasons
    not yet found.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.fx

from ckptplan.devices import Device, op_kind
from ckptplan.profiling.costs import op_flops
from ckptplan.stepping.fusion import fused_away, is_view


def graph_seconds(graph: torch.fx.GraphModule, device: Device) -> float:
    """The seconds ``graph``'s kernels take on ``device`` (Note [pricing the partition]).

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> from ckptplan.devices import get_device
    >>> def step(x, w):
    ...     return torch.relu(x @ w).sum()
    >>> graph = make_fx(step, tracing_mode="fake")(torch.ones(64, 64), torch.ones(64, 64))
    >>> cpu = get_device("cpu", compiled=True)
    >>> graph_seconds(graph, cpu) > cpu.op_time("matmul", 2 * 64**3, 0, half=False)
    True
    """
    roofline = replace(device, fused=False)  # fusion is modelled here, node by node
    away = fused_away(graph.graph)
    total = 0.0
    for node in graph.graph.nodes:
        if node.op != "call_function" or not hasattr(node.target, "_schema") or is_view(node):
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), _value)
        out = node.meta.get("val")
        flops = op_flops(node.target, args, kwargs, out)
        half = any(t.dtype in (torch.float16, torch.bfloat16) for t in _tensors(out))
        # A fused-away node runs inside its users' kernels, which read its inputs.
        moved = 0 if node in away else _bytes(out) + _kernel_reads(node, away)
        total += roofline.op_time(op_kind(str(node.target)), flops, moved, half)
    return total


def _kernel_reads(node: torch.fx.Node, away: set[torch.fx.Node]) -> int:
    """Bytes the kernel that writes ``node`` reads from memory: each input of it, or of the
    fused-away nodes it inlines, read once however many of them use it."""
    read: dict[torch.fx.Node, int] = {}
    stack = list(node.all_input_nodes)
    inlined: set[torch.fx.Node] = set()
    while stack:
        arg = stack.pop()
        if _in_memory(arg, away):
            read.setdefault(arg, _bytes(_value(arg)))
        elif arg not in inlined:
            inlined.add(arg)
            stack.extend(_base(arg).all_input_nodes)
    return sum(read.values())


def _value(node: torch.fx.Node) -> Any:
    return node.meta.get("val")


def _in_memory(node: torch.fx.Node, away: set[torch.fx.Node]) -> bool:
    """Whether a kernel reads ``node``'s value from memory: it was written out (through any
    views of it), not computed in the reading kernel's registers."""
    return _base(node) not in away


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
