"""The op graph of a profiled step, chain plans written as its schedules, and the ILP gap."""

import gc
from dataclasses import replace

import networkx as nx
import pytest
import torch
from torch.utils.module_tracker import ModuleTracker

from ckptplan.devices import get_device
from ckptplan.loading import LiveModel, load_model_file
from ckptplan.planning.opgraph import optimality_gap, schedule_of_plan, to_remat_problem
from ckptplan.planning.problem import selective_menus, to_chain
from ckptplan.planning.schedule_plan import plan_from_schedule
from ckptplan.profiling.costs import OpRecorder
from ckptplan.profiling.profiler import Settings, profile_model
from ckptplan.solvers import run_solver
from ckptplan.solvers.remat import topological_order
from ckptplan.solvers.remat_check import check_schedule
from ckptplan.values.budget import ResolvedBudget
from tests.conftest import MODELS, ROOT

HUGE = 1 << 60


def _module(path):
    return load_model_file(path).module


@pytest.fixture(scope="module")
def mlp():
    """Four MLP blocks of width 16: a graph the ILP solves in well under a second."""
    mod = _module(ROOT / "sample_models" / "mlp.py")
    workload = LiveModel(mod.MLP(width=16, n_blocks=4), (torch.randn(32, 16),), mod.loss_fn)
    profile = profile_model(workload, Settings())
    menus = selective_menus(profile)
    return profile, to_remat_problem(profile), menus, to_chain(profile, "activations", menus)


@pytest.fixture(scope="module")
def gpt():
    """Two tiny decoder blocks: dropout (in-place ops), views, a mask shared by the blocks."""
    mod = _module(MODELS / "tiny_gpt.py")
    workload = LiveModel(mod.TinyGPT(depth=2), mod.example_inputs(1), mod.loss_fn)
    profile = profile_model(workload, Settings())
    menus = selective_menus(profile)
    return profile, to_remat_problem(profile), menus, to_chain(profile, "activations", menus)


def test_records_name_their_producers_by_storage() -> None:
    recorder = OpRecorder(get_device("cpu"), ModuleTracker())
    with recorder.modules, recorder:
        a = torch.ones(4, 4)
        b = a.t().mul(2)  # the view is not recorded: mul reads the producer of a's storage
        b.relu_()  # in place: later readers depend on it
        c = b + a
    ops = [r.op for r in recorder.records]
    assert ops == ["aten.ones.default", "aten.mul.Tensor", "aten.relu_.default", "aten.add.Tensor"]
    ones, mul, relu, add = recorder.records
    assert mul.inputs == (0,) and relu.inputs == (1,) and set(add.inputs) == {2, 0}
    assert ones.allocated_bytes == mul.allocated_bytes == 64 and relu.allocated_bytes == 0
    assert relu.overwritten_bytes == 64 and mul.mutated_later
    # Only indices are kept: once the tensors die, so do the recorder's entries for them.
    del a, b, c
    gc.collect()
    assert not recorder._writer and not recorder._producer


def test_every_saved_tensor_is_read_by_a_backward_op() -> None:
    """Saved-tensor hooks say independently which op outputs backward needs."""
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8), torch.nn.Dropout(0.5)
    )
    recorder = OpRecorder(get_device("cpu"), ModuleTracker())
    saved: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        producer = recorder._writer.get(t.untyped_storage()._cdata)
        if producer is not None:
            saved.add(producer)
        return t

    with recorder.modules, recorder:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(torch.randn(4, 8)).square().mean()
        first_backward = len(recorder.records)
        loss.backward()
    records = recorder.records
    assert saved
    for producer in saved:
        readers = [i for i, r in enumerate(records[first_backward:]) if producer in r.inputs]
        assert readers, f"nothing in backward reads {records[producer].op}"


def test_graph_is_acyclic_and_keeps_the_execution_order(gpt) -> None:
    profile, graph, _, _ = gpt
    assert nx.is_directed_acyclic_graph(graph.problem.graph())
    ops_in_t = [v for v in topological_order(graph.problem) if v < graph.n_ops]
    assert ops_in_t == list(range(graph.n_ops))
    assert all(p.startswith(("fwd:", "bwd:")) for p in graph.phases)
    assert not any(profile.ops[r].phase == "opt" for r in graph.records)
    edges = set(graph.problem.edges)
    # Block 0's backward reads what its forward saved: the layer norms and the dropout masks.
    fwd, bwd = graph.forward_ops(0), graph.backward_ops(0)
    name = {v: profile.ops[graph.records[v]].op for v in range(graph.n_ops)}
    for forward_op, backward_op in (
        ("aten.native_layer_norm.default", "aten.native_layer_norm_backward.default"),
        ("aten.div_.Scalar", "aten.mul.Tensor"),
    ):
        producers = [u for u in fwd if name[u] == forward_op]
        readers = [v for v in bwd if name[v] == backward_op]
        assert producers and readers
        for u in producers:
            assert any((u, v) in edges for v in readers), forward_op


def test_the_none_plan_recomputes_nothing(mlp) -> None:
    profile, graph, _, chain = mlp
    order = schedule_of_plan(graph, profile, run_solver("none", chain, None))
    assert sorted(order) == sorted(node.id for node in graph.problem.nodes)
    cost, _ = check_schedule(graph.problem, order, HUGE)
    assert cost == graph.total_cost


def test_the_full_plan_recomputes_each_blocks_forward(mlp) -> None:
    profile, graph, _, chain = mlp
    full = run_solver("full", chain, None)
    forward = sum(
        graph.problem.nodes[v].cost
        for b in range(len(profile.blocks))
        for v in graph.forward_ops(b)
    )
    cost, _ = check_schedule(
        graph.problem, schedule_of_plan(graph, profile, full, early_stop=False), HUGE
    )
    assert cost == graph.total_cost + forward
    # Early stop skips the GELU at the end of each block: its backward needs only its input.
    stopped, _ = check_schedule(graph.problem, schedule_of_plan(graph, profile, full), HUGE)
    gelus = sum(
        graph.problem.nodes[v].cost
        for b in range(len(profile.blocks))
        for v in graph.forward_ops(b)[-1:]
    )
    assert stopped == cost - gelus


@pytest.mark.parametrize("name", ["none", "full", "sqrt", "auto-low", "auto-mid"])
def test_translated_plans_are_valid_schedules(gpt, name) -> None:
    profile, graph, menus, chain = gpt
    if name.startswith("auto"):
        lo, hi = run_solver("full", chain, None).peak, run_solver("none", chain, None).peak
        budget = lo if name == "auto-low" else (lo + hi) // 2
        schedule = run_solver("auto", chain, budget)
    else:
        schedule = run_solver(name, chain, None)
    order = schedule_of_plan(graph, profile, schedule, menus=menus)
    cost, peak = check_schedule(graph.problem, order, HUGE)
    assert cost >= graph.total_cost and peak > 0
    plan = plan_from_schedule(
        profile, chain, schedule, ResolvedBudget("1GB", 10**9, "activations"), menus
    )
    assert schedule_of_plan(graph, profile, plan) == order


def test_kept_ops_are_not_recomputed(mlp) -> None:
    profile, graph, menus, chain = mlp
    option = next(i for i, s in enumerate(menus[1]) if "aten.addmm.default#0" in s.saved)
    schedule = run_solver("none", chain, None)
    selective = replace(schedule, segments=((1, 2),), options=((1, option),))
    plain = replace(schedule, segments=((1, 2),))
    addmm = graph.forward_ops(1)[0]
    assert schedule_of_plan(graph, profile, selective, menus=menus).count(addmm) == 1
    assert schedule_of_plan(graph, profile, plain, menus=menus).count(addmm) == 2


def test_the_ilp_is_never_worse_than_auto(mlp) -> None:
    profile, graph, menus, chain = mlp
    lo, hi = run_solver("full", chain, None).peak, run_solver("none", chain, None).peak
    for budget in (lo, (lo + hi) // 2):
        schedule = run_solver("auto", chain, budget)
        report = optimality_gap(profile, chain, schedule, 10, menus=menus, graph=graph)
        assert report.ilp_status == "optimal"
        assert report.ilp_cost <= report.auto_cost
        assert report.ilp_peak <= report.auto_peak == report.budget
        assert report.gap >= 0 and report.ilp_lower_bound <= report.ilp_cost
