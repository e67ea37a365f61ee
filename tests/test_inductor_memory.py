"""Inductor's memory lines replayed (``ckptplan.stepping.inductor_memory``): the compiled fake
run's figure for what a graph holds while it runs. The allocator-measured checks are in
``tests/test_compiled_plan.py`` (slow tier)."""

from __future__ import annotations

from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._inductor.compile_fx import select_decomp_table

from ckptplan.stepping.compiled import CompiledModel, Partition, partitioning_backend
from ckptplan.stepping.inductor_memory import GraphMemory, graph_memory

N = 64
FLOAT = 4


def lowered(fn: Any, *inputs: torch.Tensor) -> dict[str, GraphMemory | None]:
    """The memory of ``fn``'s forward and backward graphs as inductor would compile them."""
    found: dict[str, GraphMemory | None] = {}

    def compiler(kind: str) -> Any:
        def compile_graph(graph: torch.fx.GraphModule, example_inputs: Any) -> Any:
            found[kind] = graph_memory(graph, example_inputs, is_backward=kind == "backward")
            return make_boxed_func(graph.forward)

        return compile_graph

    backend = aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        decompositions=select_decomp_table(),  # inductor lowers only what it decomposes to
    )
    CompiledModel(fn, backend)(*inputs).sum().backward()
    return found


class TwoMatmuls(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(N, N))
        self.b = torch.nn.Parameter(torch.randn(N, N))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.a).sin() @ self.b


def test_inductor_lowers_both_graphs_without_compiling_a_kernel() -> None:
    found = lowered(TwoMatmuls(), torch.randn(N, N))
    assert set(found) == {"forward", "backward"}
    forward, backward = found["forward"], found["backward"]
    assert forward is not None and backward is not None, "lowering fell back to eager kernels"
    matrix = N * N * FLOAT
    # Forward: x @ a (saved for sin's gradient) and the output; sin fuses into the second
    # matmul's input, which inductor writes out: three matrices at most, two at least.
    assert 2 * matrix <= forward.peak(block=1) <= 3 * matrix
    assert forward.freeable == (), "parameters and the batch are the caller's"
    # Backward frees what forward saved as it goes: its inputs are freeable.
    assert backward.inputs and sum(backward.inputs) >= matrix
    assert backward.peak(block=1) >= sum(backward.inputs)


def test_rounding_to_blocks_counts_every_storage_whole() -> None:
    memory = GraphMemory(inputs=(100,), events=(1, -1, 600, -100), freeable=(0,))
    assert memory.peak(block=1) == 700
    assert memory.peak(block=512) == 512 + 1024


def test_a_graph_inductor_cannot_lower_gives_none() -> None:
    graph = torch.fx.symbolic_trace(lambda x: x + 1)
    assert graph_memory(graph, ["not a tensor"], is_backward=False) is None


def test_the_compiled_fake_runs_backend_reads_every_graphs_memory_from_inductor() -> None:
    log = Partition()
    CompiledModel(TwoMatmuls(), partitioning_backend(log))(torch.randn(N, N)).sum().backward()
    assert (log.graphs, log.lowered_graphs) == (1, 2), "forward and backward, both lowered"
    assert log.to_json()["lowered_graphs"] == 2
