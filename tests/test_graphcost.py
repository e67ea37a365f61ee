"""Pricing a compiled graph kernel by kernel (``ckptplan.stepping.graphcost``): a value inductor
fuses into its reader is neither written nor read back, one a library kernel reads is both, a
fused kernel reads each input once, and a matmul pays its FLOPs, on the device's roofline
(the chain's discount for fusion is not taken again); where inductor lowers the graph, its
scheduler's kernels are priced, a saved chain of pointwise ops as one kernel and a library
call of several outputs once."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._inductor.compile_fx import select_decomp_table
from torch.fx.experimental.proxy_tensor import make_fx

from ckptplan.devices import Device, get_device
from ckptplan.profiling.costs import eager_seconds
from ckptplan.stepping.compiled import CompiledModel
from ckptplan.stepping.graphcost import graph_seconds, inferred_kernels
from ckptplan.stepping.inductor_memory import GraphMemory, graph_memory
from ckptplan.stepping.kernelcost import cached_bytes
from ckptplan.values.profile_types import OpRecord

CPU = get_device("cpu", compiled=True)
UNCACHED = replace(CPU, cache_bytes=0)
ROOFLINE = get_device("cpu")
N = 64
BYTES = N * N * 4


def priced(fn, *shapes: tuple[int, ...], device: Device = CPU) -> float:
    graph = make_fx(fn, tracing_mode="fake")(*(torch.ones(s) for s in shapes))
    return graph_seconds(graph, device)


def memory(nbytes: int) -> float:
    return ROOFLINE.op_time("memory", 0.0, nbytes, half=False)


def fetched(nbytes: int) -> int:
    """What a pointwise kernel's write of ``nbytes`` to its graph's output moves again
    (Note [a fresh buffer is read before it is written])."""
    return int(CPU.efficiency.write_allocate * nbytes)


def test_a_pointwise_op_fused_into_its_reader_moves_only_its_input() -> None:
    # relu runs inside sum's kernel, which reads x from memory and writes the sum.
    expected = memory(BYTES + 4 + fetched(4)) + memory(0)
    assert priced(lambda x: torch.relu(x).sum(), (N, N)) == pytest.approx(expected, rel=1e-12)


def test_a_fused_kernel_reads_each_input_once() -> None:
    one = priced(lambda x: torch.relu(x).sum(), (N, N))
    three = priced(lambda x: (torch.relu(x) * torch.sigmoid(x)).sum(), (N, N))
    assert three == pytest.approx(one, rel=1e-9)


def test_a_value_a_matmul_reads_is_written_and_read_back() -> None:
    fused = priced(lambda x, w: torch.relu(x).sum() + w.sum(), (N, N), (N, N))
    unfused = priced(lambda x, w: (torch.relu(x) @ w).sum(), (N, N), (N, N), device=UNCACHED)
    matmul = ROOFLINE.op_time("matmul", 2.0 * N**3, 3 * BYTES, half=False, cached=0)
    relu_written = memory(2 * BYTES)
    assert unfused == pytest.approx(relu_written + matmul + memory(BYTES + 4), rel=1e-12)
    assert unfused > fused


def test_a_value_read_soon_after_it_is_written_is_read_from_the_cache() -> None:
    # relu's value and the matmul's are each read by the next kernel and die in the graph: both
    # are read from the cache. relu's kernel still writes its value to memory (Note [a
    # written line goes back to memory]); the matmul hides its write behind its FLOPs.
    priced_here = priced(lambda x, w: (torch.relu(x) @ w).sum(), (N, N), (N, N))
    relu = ROOFLINE.op_time("memory", 0.0, 2 * BYTES, half=False, cached=0)
    matmul = ROOFLINE.op_time("matmul", 2.0 * N**3, 3 * BYTES, half=False, cached=2 * BYTES)
    total = ROOFLINE.op_time("memory", 0.0, BYTES + 4 + fetched(4), half=False, cached=BYTES)
    assert priced_here == pytest.approx(relu + matmul + total, rel=1e-12)
    assert total < memory(BYTES + 4), "the cache serves bytes faster than memory"
    # A value the graph hands on (saved for backward) is written to memory, whoever reads it,
    # into a fresh buffer the CPU fetches first.
    saved = priced(lambda x, w: (lambda y: (y, y @ w))(torch.relu(x)), (N, N), (N, N))
    kept = ROOFLINE.op_time("memory", 0.0, 2 * BYTES + fetched(BYTES), half=False)
    out = ROOFLINE.op_time("matmul", 2.0 * N**3, 3 * BYTES, half=False, cached=BYTES)
    assert saved == pytest.approx(kept + out, rel=1e-12)


def test_a_library_call_pays_for_its_bytes_from_memory_on_top_of_its_flops() -> None:
    # On the CPU a GEMM packs its operands before it multiplies them: what it reads from
    # memory, and writes there, is not hidden behind its FLOPs; what the cache serves is.
    n = 256  # a compute-bound matmul
    hidden = replace(CPU, efficiency=replace(CPU.efficiency, stall=0.0))
    saved_operand = priced(lambda x, w: x @ w, (n, n), (n, n))
    assert saved_operand - priced(lambda x, w: x @ w, (n, n), (n, n), device=hidden) == (
        pytest.approx(3 * n * n * 4 / CPU.bandwidth, rel=1e-9)
    )
    # relu's value is just written: only w and the graph's output move from and to memory.
    recomputed_operand = priced(lambda x, w: torch.relu(x) @ w, (n, n), (n, n))
    stalled = recomputed_operand - priced(
        lambda x, w: torch.relu(x) @ w, (n, n), (n, n), device=hidden
    )
    assert stalled == pytest.approx(2 * n * n * 4 / CPU.bandwidth, rel=1e-9)


def optimizer_op(moved: int, phase: str = "opt") -> OpRecord:
    return OpRecord(
        "aten.add_.Tensor", phase, "", False, 0, 0, 0.0, 0.0, False, True, moved_bytes=moved
    )


def test_an_optimizer_step_over_parameters_the_cache_holds_runs_from_it() -> None:
    # AdamW's ops reread one parameter's few tensors; a foreach op moves all of them at once.
    eager = replace(CPU, fused=False)
    parameter = CPU.cache_bytes // 4
    per_parameter = [optimizer_op(parameter) for _ in range(16)]
    foreach = [optimizer_op(16 * parameter)]
    from_memory = 16 * parameter / CPU.bandwidth
    assert eager_seconds(foreach, eager, measured=False) == pytest.approx(from_memory)
    assert eager_seconds(per_parameter, eager, measured=False) == pytest.approx(
        from_memory * CPU.bandwidth / CPU.cache_bandwidth
    )
    assert eager_seconds([optimizer_op(parameter, "fwd:0")], eager, measured=False) == 0


def test_views_cost_nothing() -> None:
    plain = priced(lambda x: torch.relu(x).sum(), (N, N))
    viewed = priced(lambda x: torch.relu(x.view(N * N)).sum(), (N, N))
    assert viewed == plain


def forward_lowered(
    fn: Any, *inputs: torch.Tensor, backward: bool = False
) -> tuple[torch.fx.GraphModule, GraphMemory]:
    """``fn``'s partitioned forward graph (or its backward graph), and inductor's lowering."""
    found: dict[bool, tuple[torch.fx.GraphModule, GraphMemory | None]] = {}

    def compiler(is_backward: bool) -> Any:
        def lower(graph: torch.fx.GraphModule, example_inputs: Any) -> Any:
            found[is_backward] = (graph, graph_memory(graph, example_inputs, is_backward))
            return make_boxed_func(graph.forward)

        return lower

    backend = aot_autograd(
        fw_compiler=compiler(False),
        bw_compiler=compiler(True),
        decompositions=select_decomp_table(),
    )
    CompiledModel(fn, backend)(*inputs).sum().backward()
    graph, memory = found[backward]
    assert memory is not None and memory.kernels is not None, "inductor did not lower it"
    return graph, memory


class SavedChain(torch.nn.Module):
    """Pointwise ops whose values backward needs, between two matmuls."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(N, N))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.w).tanh().sigmoid().tanh() @ self.w


def test_inductors_kernels_write_each_saved_value_once_and_read_none_back() -> None:
    graph, memory = forward_lowered(SavedChain(), torch.randn(N, N))
    kinds = [k.kind for k in memory.kernels]
    assert kinds == ["matmul", "memory", "matmul"], "the three pointwise ops run as one kernel"
    outputs = graph.graph.output_node().args[0][1:]
    saved = sum(v.meta["val"].numel() * 4 for v in outputs if v.op == "call_function")
    chain = memory.kernels[1]
    # It reads the first matmul's output and writes the values backward needs, or those it
    # recomputes them from, and the second matmul's input: no value written is read back.
    assert chain.moved <= BYTES + saved + BYTES
    # The groups inferred from the graph, where inductor does not lower it, are inductor's here.
    assert graph_seconds(graph, CPU) == pytest.approx(graph_seconds(graph, CPU, memory.kernels))


class Attention(torch.nn.Module):
    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, q, q)


def test_a_library_call_with_several_outputs_is_priced_once() -> None:
    q = torch.randn(1, 2, N, 16, requires_grad=True)
    graph, memory = forward_lowered(Attention(), q)
    attention = [k for k in memory.kernels if k.kind == "attention"]
    flops = sum(k.flops for k in inferred_kernels(graph.graph) if k.kind == "attention")
    assert len(attention) == 1 and attention[0].flops == flops > 0


class CheckpointedAttention(torch.nn.Module):
    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(Attention(), q, use_reentrant=False)


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "recomputed"])
def test_attention_in_a_checkpointed_region_is_priced_at_its_flops(backward: bool) -> None:
    """Note [attention in a checkpointed region]: inside a region the partitioner wraps
    attention in the random-state wrappers, run in forward and again where backward
    recomputes it; each is priced as the attention it runs, not as bytes moved."""
    q = torch.randn(1, 2, N, 16, requires_grad=True)
    _, plain = forward_lowered(Attention(), q)
    graph, memory = forward_lowered(CheckpointedAttention(), q, backward=backward)
    wrapped = [n for n in graph.graph.nodes if "rng_state" in str(n.target)]
    assert wrapped, "the region's attention is wrapped"
    forward_flops = [k.flops for k in plain.kernels if k.kind == "attention"]
    attention = [k for k in memory.kernels if k.kind == "attention"]
    inferred = [k for k in inferred_kernels(graph.graph) if k.kind == "attention"]
    # Backward runs the forward attention again beside attention's own backward kernel.
    assert forward_flops[0] > 0 and forward_flops[0] in [k.flops for k in attention]
    assert sorted(k.flops for k in inferred) == sorted(k.flops for k in attention)
    assert len(attention) == (2 if backward else 1)


class CheckpointedChain(SavedChain):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(super().forward, x, use_reentrant=False)


def test_a_recomputed_chain_is_read_from_the_cache_and_a_saved_one_from_memory() -> None:
    """Note [recompute reads from cache], on inductor's own kernels: backward reads what the
    forward graph saved from memory, and what it recomputes from the cache."""
    x = torch.randn(N, N, requires_grad=True)
    saved, kept = forward_lowered(SavedChain(), x, backward=True)
    rebuilt, recomputed = forward_lowered(CheckpointedChain(), x, backward=True)
    for graph, memory in ((saved, kept), (rebuilt, recomputed)):
        inputs = {n.name for n in graph.graph.find_nodes(op="placeholder")}
        hits = cached_bytes(memory.kernels, CPU.cache_bytes)
        # Everything here fits the cache: only a graph input's first read comes from memory,
        # and only pointwise kernels and what the graph hands on (gradients) write there.
        seen: set[str] = set()
        for kernel, hit in zip(memory.kernels, hits, strict=True):
            first = {name for name, _ in kernel.reads if name in inputs - seen}
            seen |= first
            from_cache = sum(size for name, size in kernel.reads if name not in first)
            if kernel.kind != "memory":
                from_cache += sum(size for name, size in kernel.writes if name not in kernel.kept)
            assert hit == from_cache
    read_back = sum(
        size for k in kept.kernels for name, size in k.reads if name in saved_values(saved)
    )
    recomputed_reads = sum(
        size for k in recomputed.kernels for name, size in k.reads if name in saved_values(rebuilt)
    )
    assert read_back > recomputed_reads, "the unchecked backward reads the chain's values back"
    assert graph_seconds(rebuilt, CPU, recomputed.kernels) < graph_seconds(
        rebuilt, UNCACHED, recomputed.kernels
    )


def saved_values(backward: torch.fx.GraphModule) -> set[str]:
    """The placeholders of ``backward`` its forward graph saved (not incoming gradients)."""
    placeholders = backward.graph.find_nodes(op="placeholder")
    return {n.name for n in placeholders if not n.name.startswith("tangents")}
