"""Exact rematerialization: budgets, the independent checker, the solver against brute force,
large random graphs, the Checkmate instances and the ``remat`` command."""

from __future__ import annotations

import doctest
import itertools
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from ckptplan.cli.remat import remat
from ckptplan.solvers import remat as remat_module
from ckptplan.solvers import remat_check
from ckptplan.solvers.remat import (
    RematNode,
    RematProblem,
    Status,
    greedy_schedule,
    load_instance,
    memory_budget,
    memory_lower_bound,
    peak_without_recomputation,
    solve,
    topological_order,
)
from ckptplan.solvers.remat_check import check_schedule
from tests.conftest import ROOT

pytestmark = pytest.mark.torchfree

INSTANCES = Path(
    os.environ.get("CKPTPLAN_REMAT_INSTANCES", ROOT.parent / "shared" / "remat-instances")
)
needs_instances = pytest.mark.skipif(
    not INSTANCES.is_dir(),
    reason=f"no Checkmate instances at {INSTANCES}: set CKPTPLAN_REMAT_INSTANCES to their folder",
)

PINNED = {
    "vgg16_b256_train": (15825108992, 14242598093, 12660087194),
    "vgg19_b256_train": (17058234368, 15352410932, 13646587495),
    "mobilenet_b512_train": (34701056000, 31230950400, 27760844800),
    "resnet50_b256_train": (38059356160, 34253420544, 30447484928),
    "fcn_8_vgg_b32_train": (13484795520, 12136315968, 10787836416),
    "segnet_b32_train": (19943884288, 17949495860, 15955107431),
    "vgg_unet_b32_train": (20959461376, 18863515239, 16767569101),
}


def problem_of(costs: list[int], mems: list[int], edges: list[tuple[int, int]]) -> RematProblem:
    pairs = zip(costs, mems, strict=True)
    nodes = tuple(RematNode(i, cost=c, mem=m) for i, (c, m) in enumerate(pairs))
    return RematProblem(nodes=nodes, edges=tuple(edges))


def checked(problem: RematProblem, result: remat_module.RematSchedule) -> None:
    """Every returned schedule passes the independent checker with the reported figures."""
    assert result.order, result.reason
    cost, peak = check_schedule(problem, result.order, result.budget)
    assert (cost, peak) == (result.cost, result.peak)
    assert result.total_cost <= result.lower_bound <= cost
    assert result.total_cost <= result.order_bound
    assert result.gap == pytest.approx((cost - result.lower_bound) / cost if cost else 0)


# --- budgets and reading ---------------------------------------------------------------------


@needs_instances
@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_budgets_are_exact(name: str) -> None:
    problem = load_instance(INSTANCES / f"{name}.json")
    peak, at_09, at_08 = PINNED[name]
    assert peak_without_recomputation(problem) == peak
    assert memory_budget(problem, 0.9) == at_09
    assert memory_budget(problem, 0.8) == at_08
    assert check_schedule(problem, topological_order(problem), peak) == (problem.total_cost, peak)


def test_budget_rounds_up_from_the_decimal_ratio() -> None:
    # peak 10: 10 * 0.7 is 7.000000000000001 in floats, the budget is exactly 7.
    problem = problem_of([1, 1], [5, 5], [(0, 1)])
    assert peak_without_recomputation(problem) == 10
    assert memory_budget(problem, 0.7) == 7
    assert memory_budget(problem, 0.71) == 8
    with pytest.raises(ValueError):
        memory_budget(problem, 0)


def test_reader_accepts_both_spellings(tmp_path: Path) -> None:
    checkmate = {
        "directed": True,
        "graph": {"name": "g"},
        "nodes": [{"id": 0, "cost_cpu": 3, "cost_ram": 7}, {"id": 1, "cost_cpu": 4, "cost_ram": 2}],
        "links": [{"source": 0, "target": 1}],
    }
    layered = {
        "directed": True,
        "graph": {"name": "g"},
        "nodes": [{"id": 0, "duration": 3, "out_cost": 7}, {"id": 1, "duration": 4, "out_cost": 2}],
        "links": [{"0": 0, "1": 1}],
    }
    paths = []
    for i, data in enumerate((checkmate, layered)):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(data))
    first, second = (load_instance(p) for p in paths)
    assert first == second
    assert first.nodes == (RematNode(0, 3, 7), RematNode(1, 4, 2)) and first.edges == ((0, 1),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"nodes": [{"id": 0}], "links": []}', "has none of"),
        ('{"nodes": [{"id": 0, "cost_cpu": 1, "cost_ram": "x"}], "links": []}', "not a number"),
        ('{"nodes": [], "links": [{"source": 0, "target": 1}]}', "unknown node"),
        ('{"graph": {}}', "no 'nodes' list"),
    ],
)
def test_reader_rejects_malformed_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_instance(path)


def test_problem_rejects_cycles() -> None:
    with pytest.raises(ValueError, match="cycle"):
        problem_of([1, 1], [1, 1], [(0, 1), (1, 0)])


# --- the independent checker ------------------------------------------------------------------


def diamond() -> RematProblem:
    """0 feeds 1 and 2, both feed 3; 0 is big, so recomputing it can pay."""
    return problem_of([1, 1, 1, 1], [10, 1, 1, 1], [(0, 1), (0, 2), (1, 3), (2, 3)])


def test_checker_accepts_valid_schedules_and_counts_recomputation() -> None:
    p = diamond()
    assert check_schedule(p, [0, 1, 2, 3], budget=12) == (4, 12)
    # A recomputed copy of 0 made just for 2: the first copy is freed after 1 reads it.
    assert check_schedule(p, [0, 1, 0, 2, 3], budget=12) == (5, 12)
    chain = problem_of([2, 3, 5], [4, 4, 4], [(0, 1), (1, 2), (0, 2)])
    assert check_schedule(chain, [0, 1, 2], budget=12) == (10, 12)
    assert check_schedule(chain, [0, 1, 0, 2], budget=12) == (12, 12)


@pytest.mark.parametrize(
    ("order", "budget", "message"),
    [
        ([0, 1, 2], 100, "node 3 never runs"),
        ([0, 1, 3, 2], 100, "runs node 3 before its input 2"),
        ([1, 0, 2, 3], 100, "runs node 1 before its input 0"),
        ([0, 1, 2, 3], 11, "exceeds the budget 11"),
        ([0, 1, 2, 7], 100, "not a node"),
    ],
)
def test_checker_rejects_invalid_schedules(order: list[int], budget: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_schedule(diamond(), order, budget)


def test_docstring_examples() -> None:
    for module in (remat_module, remat_check):
        assert doctest.testmod(module).failed == 0


# --- brute force on tiny graphs ---------------------------------------------------------------


def schedules(problem: RematProblem, extra: int, first: list[int] | None) -> Iterator[list[int]]:
    """Every sequence with at most ``extra`` recomputations in which each node runs after its
    inputs; with ``first`` given, first computations follow that order."""
    ids = [node.id for node in problem.nodes]
    preds = {v: {u for u, w in problem.edges if w == v} for v in ids}

    def grow(prefix: list[int], done: set[int], left: int) -> Iterator[list[int]]:
        if len(done) == len(ids):
            yield prefix
        for v in ids:
            if not preds[v] <= done:
                continue
            if v in done:
                if left:
                    yield from grow([*prefix, v], done, left - 1)
            elif first is None or first[len(done)] == v:
                yield from grow([*prefix, v], done | {v}, left)

    yield from grow([], set(), extra)


def stage_schedules(problem: RematProblem) -> Iterator[list[int]]:
    """Every stage-form schedule over ``T``: stage t recomputes any subset of earlier nodes in
    order ``T`` (once each), then runs ``T[t]``."""
    order = topological_order(problem)
    choices = [list(itertools.product((False, True), repeat=t)) for t in range(len(order))]
    for picks in itertools.product(*choices):
        yield [
            v
            for t, pick in enumerate(picks)
            for v in [*(order[i] for i in range(t) if pick[i]), order[t]]
        ]


def cheapest(problem: RematProblem, budget: int, candidates: Iterator[list[int]]) -> int | None:
    best = None
    for order in candidates:
        try:
            cost, _ = check_schedule(problem, order, budget)
        except ValueError:
            continue
        best = cost if best is None else min(best, cost)
    return best


def tiny_problem(rng: random.Random) -> RematProblem:
    """3-5 nodes shaped so that recomputation can pay: half are a chain with random skips,
    half a two-layer training graph (forward, loss, backward reading the forward values)."""
    if rng.random() < 0.5:
        n = rng.randint(3, 5)
        edges = [
            (i, j) for i in range(n) for j in range(i + 1, n) if j == i + 1 or rng.random() < 0.4
        ]
    else:  # f0 -> f1 -> loss -> b1 -> b0, with b1 reading f1 (and maybe f0), b0 reading f0
        n = 5
        edges = [(0, 1), (1, 2), (2, 3), (1, 3), (3, 4), (0, 4)]
        edges += [(0, 3)] if rng.random() < 0.5 else []
    return problem_of(
        [rng.randint(0, 6) for _ in range(n)], [rng.randint(1, 9) for _ in range(n)], edges
    )


def test_solver_matches_brute_force_on_tiny_graphs() -> None:
    """Every budget from just below the memory bound to peak(T), on 40 random tiny graphs."""
    rng = random.Random(2024)
    extra = 2
    recomputing = 0
    for _ in range(40):
        problem = tiny_problem(rng)
        t_order = topological_order(problem)
        floor = memory_lower_bound(problem)
        for budget in range(floor - 1, peak_without_recomputation(problem) + 1):
            result = solve(problem, budget, time_limit_s=20)
            any_order = cheapest(problem, budget, schedules(problem, extra, None))
            t_first = cheapest(problem, budget, schedules(problem, extra, t_order))
            staged = cheapest(problem, budget, stage_schedules(problem))
            case = (problem, budget, result.status, result.reason)
            if result.status is Status.INFEASIBLE:
                assert budget < floor, case
                assert any_order is None and t_first is None and staged is None, case
                continue
            if not result.order:
                assert staged is None, case
                continue
            checked(problem, result)
            assert result.status is Status.OPTIMAL, case  # tiny graphs close in time
            assert result.cost is not None
            recomputations = len(result.order) - len(problem.nodes)
            recomputing += result.cost > result.total_cost
            if recomputations <= extra:  # the enumeration contains the returned schedule
                assert any_order is not None and any_order <= result.cost, case
            if staged is not None:
                assert result.order_bound <= staged, case
                assert result.cost <= staged, case
            if result.reason == "proven optimal in the stage model":
                assert result.cost == staged, case
            if t_first is not None:
                assert result.order_bound <= t_first, case
            if result.cost == result.order_bound and t_first is not None:  # all T-first
                assert result.cost <= t_first, case
                firsts = list(dict.fromkeys(result.order))
                if firsts == t_order and recomputations <= extra:
                    assert result.cost == t_first, case
    assert recomputing >= 10  # the comparison is not vacuous


def test_budget_below_the_memory_bound_has_no_schedule_at_all() -> None:
    rng = random.Random(7)
    for _ in range(25):
        n = rng.randint(2, 5)
        edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.5]
        problem = problem_of([1] * n, [rng.randint(1, 6) for _ in range(n)], edges)
        floor = memory_lower_bound(problem)
        assert cheapest(problem, floor - 1, schedules(problem, 2, None)) is None
        assert solve(problem, floor - 1).status is Status.INFEASIBLE


# --- larger random graphs ---------------------------------------------------------------------


def random_layered(n: int, seed: int, *, training: bool) -> RematProblem:
    """A random layered DAG of about ``n`` nodes.

    Plain: each node reads 1-3 nodes of the previous three layers. Training: a forward DAG of
    that kind (mostly the previous layer, some skips), a loss, and a mirrored backward pass in
    which each gradient reads its successors' gradients, its forward value and its inputs, the
    shape of the Checkmate graphs.
    """
    rng = random.Random(seed)
    forward = (n - 1) // 2 if training else n
    width = max(2, int(forward**0.5) // (2 if training else 1))
    layers: list[list[int]] = []
    edges: list[tuple[int, int]] = []
    costs: list[int] = []
    mems: list[int] = []
    while len(costs) < forward:
        layer = list(range(len(costs), min(forward, len(costs) + rng.randint(1, width))))
        for v in layer:
            costs.append(rng.randint(1, 100))
            mems.append(rng.randint(1, 100))
            if not layers:
                continue
            if training:
                edges += [(u, v) for u in rng.sample(layers[-1], min(len(layers[-1]), 2))]
                if len(layers) > 1 and rng.random() < 0.3:
                    edges.append((rng.choice([u for lay in layers[-4:-1] for u in lay]), v))
            else:
                recent = [u for lay in layers[-3:] for u in lay]
                edges += [(u, v) for u in rng.sample(recent, min(len(recent), rng.randint(1, 3)))]
        layers.append(layer)
    if training:
        loss = len(costs)
        costs.append(rng.randint(1, 100))
        mems.append(1)
        edges += [(u, loss) for u in layers[-1]]
        succs: dict[int, list[int]] = {v: [] for v in range(loss)}
        preds: dict[int, list[int]] = {v: [] for v in range(loss + 1)}
        for u, v in edges:
            if v < loss:
                succs[u].append(v)
            preds[v].append(u)
        grad = {loss: loss}
        for v in reversed(range(loss)):
            grad[v] = len(costs)
            costs.append(2 * costs[v])
            mems.append(mems[v])
            edges += [(grad[s], grad[v]) for s in succs[v] or [loss]]
            edges += [(v, grad[v]), *((u, grad[v]) for u in preds[v])]
    return problem_of(costs, mems, sorted(set(edges)))


@pytest.mark.parametrize(
    ("n", "seed", "training", "ratio", "limit"),
    [
        (60, 1, False, 0.9, 10),
        (100, 3, False, 0.8, 10),
        pytest.param(200, 1, False, 0.9, 5, marks=pytest.mark.slow),
        (100, 2, True, 0.8, 5),
        pytest.param(300, 1, True, 0.8, 5, marks=pytest.mark.slow),
        pytest.param(1000, 1, True, 0.9, 20, marks=pytest.mark.slow),
        pytest.param(1000, 2, True, 0.7, 20, marks=pytest.mark.slow),
    ],
)
def test_random_layered_dags_get_valid_schedules(
    n: int, seed: int, training: bool, ratio: float, limit: float
) -> None:
    problem = random_layered(n, seed, training=training)
    budget = memory_budget(problem, ratio)
    result = solve(problem, budget, time_limit_s=limit)
    assert result.status in (Status.OPTIMAL, Status.FEASIBLE), result.reason
    checked(problem, result)


def test_greedy_schedule_is_valid() -> None:
    problem = random_layered(1000, 3, training=True)
    budget = memory_budget(problem, 0.8)
    order = greedy_schedule(problem, budget)
    assert order is not None
    check_schedule(problem, order, budget)


# --- the Checkmate instances ------------------------------------------------------------------


@needs_instances
def test_vgg16_at_08_is_proven_infeasible_at_once() -> None:
    problem = load_instance(INSTANCES / "vgg16_b256_train.json")
    result = solve(problem, memory_budget(problem, 0.8))
    assert result.status is Status.INFEASIBLE
    assert "memory lower bound" in result.reason
    assert result.order == []


@needs_instances
def test_vgg16_at_09_matches_or_beats_moccasin() -> None:
    problem = load_instance(INSTANCES / "vgg16_b256_train.json")
    result = solve(problem, memory_budget(problem, 0.9), time_limit_s=30)
    checked(problem, result)
    assert result.status is Status.OPTIMAL and result.gap == 0
    assert result.overhead is not None and round(100 * result.overhead, 2) <= 1.97


@needs_instances
@pytest.mark.parametrize("ratio", [0.9, 0.8])
def test_mobilenet_gets_a_valid_schedule(ratio: float) -> None:
    problem = load_instance(INSTANCES / "mobilenet_b512_train.json")
    budget = memory_budget(problem, ratio)
    order = greedy_schedule(problem, budget)
    assert order is not None
    check_schedule(problem, order, budget)
    result = solve(problem, budget, time_limit_s=30)
    checked(problem, result)


#: Moccasin's overheads from the README, as printed (``None``: it found no schedule).
MOCCASIN = {
    ("vgg16_b256_train", 0.9): "1.97",
    ("vgg19_b256_train", 0.9): "0.10",
    ("vgg19_b256_train", 0.8): "4.85",
    ("vgg_unet_b32_train", 0.9): "1.13",
    ("vgg_unet_b32_train", 0.8): "1.98",
    ("fcn_8_vgg_b32_train", 0.9): "0.029",
    ("fcn_8_vgg_b32_train", 0.8): "0.136",
    ("segnet_b32_train", 0.9): "0.103",
    ("segnet_b32_train", 0.8): "0.207",
}


@needs_instances
@pytest.mark.parametrize("name", sorted(PINNED))
@pytest.mark.parametrize("ratio", [0.9, 0.8])
def test_every_instance_matches_or_beats_the_reference(name: str, ratio: float) -> None:
    """Valid (or proven infeasible), optimal, and at most Moccasin's overhead at the precision
    the README prints it."""
    problem = load_instance(INSTANCES / f"{name}.json")
    result = solve(problem, memory_budget(problem, ratio), time_limit_s=120)
    if (name, ratio) == ("vgg16_b256_train", 0.8):
        assert result.status is Status.INFEASIBLE
        return
    checked(problem, result)
    assert result.status is Status.OPTIMAL
    reference = MOCCASIN.get((name, ratio))
    if reference is not None:
        decimals = len(reference.split(".")[1])
        assert result.overhead is not None
        assert round(100 * result.overhead, decimals) <= float(reference)


# --- the command ------------------------------------------------------------------------------


@needs_instances
def test_command_json_output_parses_and_its_schedule_checks() -> None:
    path = INSTANCES / "segnet_b32_train.json"
    done = CliRunner().invoke(remat, [str(path), "--memory", "0.9", "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    problem = load_instance(path)
    assert report["budget"] == PINNED["segnet_b32_train"][1]
    cost, peak = check_schedule(problem, report["schedule"], report["budget"])
    assert (cost, peak) == (report["cost"], report["peak"])
    assert report["overhead"] == pytest.approx(cost / problem.total_cost - 1)
    assert report["status"] == "optimal" and report["gap"] == 0
    for key in ("solve_seconds", "lower_bound", "peak_without_recomputation"):
        assert key in report


@needs_instances
def test_command_table_and_infeasible_budget() -> None:
    path = INSTANCES / "vgg16_b256_train.json"
    done = CliRunner().invoke(remat, [str(path), "--memory", "0.8"])
    assert done.exit_code == 0
    assert "infeasible" in done.output
    done = CliRunner().invoke(remat, [str(path), "--memory", "0.9"])
    assert done.exit_code == 0 and "optimal" in done.output and "schedule:" in done.output


@pytest.mark.parametrize(
    ("args", "content", "message"),
    [
        (["missing.json"], None, "not found"),
        (["bad.json"], "{oops", "malformed"),
        (["good.json", "--memory", "0"], "", "--memory must be a positive number"),
        (["good.json", "--memory", "-0.5"], "", "--memory must be a positive number"),
        (["good.json", "--memory", "abc"], "", "--memory must be a positive number"),
        (["good.json", "--time-limit", "0"], "", "--time-limit must be a positive number"),
    ],
)
def test_command_errors_are_one_line_with_status_2(
    tmp_path: Path, args: list[str], content: str | None, message: str
) -> None:
    good = {"nodes": [{"id": 0, "cost_cpu": 1, "cost_ram": 1}], "links": []}
    (tmp_path / "good.json").write_text(json.dumps(good))
    if content:
        (tmp_path / args[0]).write_text(content)
    args = [str(tmp_path / args[0]), *args[1:]]
    done = subprocess.run(
        [sys.executable, "-c", "from ckptplan.cli.remat import remat; remat()", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_command_module_does_not_import_torch() -> None:
    code = "import sys, ckptplan.cli.remat; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
