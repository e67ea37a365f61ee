"""A plan under ``torch.compile``: no graph breaks from the wrapper, one checkpoint per region
in the graph, and training with the eager unchecked model's gradients (``aot_eager``).

The plan joins blocks, nests one and gives one a selective policy that also offloads, so every
path through ``apply`` is traced. tiny_gpt has dropout on; the compiled run replays the same masks.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch._dynamo
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

import ckptplan
import ckptplan.rewriting.graph
from ckptplan.loading import ModelFile, call_model, load_model_file
from ckptplan.profiling.training import make_optimizer
from ckptplan.values.plan import Plan
from tests.conftest import MODELS, ROOT
from tests.test_rewrite import original_name, plan_for

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)

REGIONS = [
    {"modules": ["layers.0", "layers.1"], "children": [{"modules": ["layers.0"]}]},
    {
        "modules": ["layers.3"],
        "policy": {"save": ["aten.addmm.default#0"], "offload": ["aten.gelu.default#0"]},
    },
    {"modules": ["layers.4", "layers.5"]},
]
STEPS = 2


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def model_file() -> ModelFile:
    return load_model_file(MODELS / "tiny_gpt.py")


def planned(model_file: ModelFile) -> tuple[torch.nn.Module, torch.nn.Module, Plan]:
    torch.manual_seed(0)
    reference = model_file.build().train()
    plan = plan_for(reference, REGIONS)
    return reference, ckptplan.apply(copy.deepcopy(reference), plan), plan


def train(model_file: ModelFile, model: torch.nn.Module, params: torch.nn.Module) -> list[dict]:
    """Gradients of each of STEPS seeded AdamW steps (``params`` owns the parameters)."""
    optimizer = make_optimizer("adamw", params)
    grads = []
    for step in range(STEPS):
        torch.manual_seed(100 + step)
        inputs = model_file.inputs(2)
        torch.manual_seed(200 + step)
        model_file.loss(call_model(model, inputs)).backward()
        grads.append({n: p.grad.clone() for n, p in params.named_parameters()})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return grads


def assert_same(expected: list[dict], got: list[dict]) -> None:
    for before, after in zip(expected, got, strict=True):
        assert before.keys() == after.keys()
        for name in before:
            assert torch.allclose(before[name], after[name], atol=1e-6, rtol=0), name


def test_the_wrapper_adds_no_graph_break_and_one_checkpoint_per_region(model_file) -> None:
    reference, model, _ = planned(model_file)
    inputs = model_file.inputs(2)
    plain = torch._dynamo.explain(reference)(*inputs)
    checked = torch._dynamo.explain(model)(*inputs)
    assert checked.graph_break_count == plain.graph_break_count
    assert checked.graph_count == plain.graph_count
    torch._dynamo.reset()
    checkpoints: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        checkpoints.append(sum(_checkpoints(gm)))
        return gm

    torch.compile(model, backend=backend)(*inputs)
    assert sum(checkpoints) == len(REGIONS)


def test_a_planned_model_compiles_once_over_twelve_training_steps(model_file) -> None:
    """Dynamo guards on the Python state a trace reads: state the wrapper changed per call
    would recompile every step (and past the recompile limit, run eagerly for good)."""
    _, model, _ = planned(model_file)
    graphs: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(sum(_checkpoints(gm)))
        return gm

    compiled = torch.compile(model, backend=backend)
    optimizer = make_optimizer("adamw", model)
    compiles_after = []
    for step in range(12):
        torch.manual_seed(step)
        model_file.loss(call_model(compiled, model_file.inputs(2))).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        compiles_after.append(len(graphs))
    assert compiles_after == [compiles_after[0]] * 12
    assert sum(graphs) == len(REGIONS)


def test_the_compiled_forward_saves_less_for_backward(model_file) -> None:
    reference, model, _ = planned(model_file)
    inputs = model_file.inputs(2)
    plain = _saved_for_backward(model_file, reference, inputs)
    torch._dynamo.reset()
    assert _saved_for_backward(model_file, model, inputs) < plain


def _saved_for_backward(model_file: ModelFile, model: torch.nn.Module, inputs: Any) -> int:
    """Tensors the compiled forward hands to the compiled backward (outputs beyond the loss)."""
    counts: list[int] = []

    def forward(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        output = next(n for n in gm.graph.nodes if n.op == "output")
        counts.append(len(output.args[0]) - 1)
        return make_boxed_func(gm.forward)

    backend = aot_autograd(
        fw_compiler=forward, bw_compiler=lambda gm, _: make_boxed_func(gm.forward)
    )
    model_file.loss(call_model(torch.compile(model, backend=backend), inputs)).backward()
    return sum(counts)


def _checkpoints(gm: torch.fx.GraphModule) -> Iterator[int]:
    for node in gm.graph.nodes:
        yield int(node.op == "call_function" and "checkpoint" in str(node.target))


def test_a_compiled_plan_trains_with_the_unchecked_gradients(model_file) -> None:
    reference, model, _ = planned(model_file)
    expected = train(model_file, reference, reference)
    got = train(model_file, torch.compile(model, backend="aot_eager"), model)
    assert_same(expected, got)
    assert model.ckptplan_applied.recomputed == 0, "recomputation happens in the compiled graph"


def test_a_compiled_rewritten_module_trains_with_the_unchecked_gradients() -> None:
    mlp = load_model_file(ROOT / "sample_models" / "mlp.py")
    torch.manual_seed(0)
    reference = mlp.build().train()
    regions = [
        {"modules": ["blocks.0", "blocks.1"]},
        {"modules": ["blocks.4"], "policy": {"save": ["aten.addmm.default"]}},
    ]
    module = ckptplan.rewrite(copy.deepcopy(reference), plan_for(reference, regions))
    checkpoints: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        checkpoints.append(sum(_checkpoints(gm)))
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    expected = train(mlp, reference, reference)
    got = train(mlp, torch.compile(module, backend=backend), module)
    assert_same(expected, [{original_name(n): g for n, g in grads.items()} for grads in got])
    assert sum(checkpoints) == len(regions), "each region is one checkpoint in the compiled graph"


def test_the_compile_budget_peer_runs_tied_weights() -> None:
    """The peer of the sweep: AOTAutograd's min-cut partitioner under a memory budget, on a
    GPT whose head is tied to its embedding (dropout off: torch 2.13's compiled dropout draws
    other masks than eager)."""
    from ckptplan.loading import LiveModel
    from ckptplan.values.plan import PlanSettings
    from ckptplan.verifying.peers import measure_compile_budget

    module = load_model_file(ROOT / "sample_models" / "gpt.py").module
    torch.manual_seed(0)
    model = module.GPT(vocab_size=128, block_size=64, n_layer=4, n_head=2, n_embd=64, dropout=0.0)
    assert model.lm_head.weight is model.wte.weight
    batch = (torch.randint(0, 128, (16, 64)), torch.randint(0, 128, (16, 64)))
    workload = LiveModel(model, batch, module.loss_fn)
    tight = measure_compile_budget(
        workload, PlanSettings(), memory_budget=0.1, device="cpu", repeats=1
    )
    assert tight.max_grad_abs_diff <= 1e-5
    assert tight.measured_peak_bytes < 0.6 * tight.baseline_peak_bytes
