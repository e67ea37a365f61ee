"""Selective checkpointing: the knapsack frontier, block menus, and the auto solver."""

import itertools
import random
from collections import Counter
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import ckptplan
from ckptplan.loading import load_model_file
from ckptplan.planning.problem import (
    block_forward_ops,
    op_names,
    save_items,
    selective_menus,
    to_chain,
)
from ckptplan.planning.schedule_plan import plan_from_schedule
from ckptplan.planning.search import selective_pays
from ckptplan.profiling.profiler import Settings, profile_model
from ckptplan.solvers import run_solver
from ckptplan.solvers.selective import SaveItem, frontier
from ckptplan.stepping.fakerun import fake_run_peak
from ckptplan.values.budget import ResolvedBudget
from ckptplan.values.plan import Plan
from ckptplan.values.profile_types import OpRecord
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)

items_strategy = st.lists(
    st.tuples(st.integers(1, 50), st.floats(0.01, 5.0)), min_size=1, max_size=9
)


@settings(max_examples=60, deadline=None)
@given(raw=items_strategy, limit=st.integers(0, 300))
def test_frontier_is_the_exact_knapsack_optimum(raw, limit) -> None:
    items = [SaveItem((f"op{i}#0",), size, time) for i, (size, time) in enumerate(raw)]
    total = sum(t for _, t in raw)
    best = min(
        total - sum(raw[i][1] for i in chosen)
        for r in range(len(raw) + 1)
        for chosen in itertools.combinations(range(len(raw)), r)
        if sum(raw[i][0] for i in chosen) <= limit
    )
    points = [p for p in frontier(items) if p.kept_bytes <= limit]
    assert min(p.recompute_time for p in points) == pytest.approx(best, abs=1e-9)
    for p in frontier(items):
        kept = [i for i, item in enumerate(items) if item.ops[0] in p.saved]
        assert p.kept_bytes == sum(raw[i][0] for i in kept)


def test_frontier_thinning_keeps_the_ends() -> None:
    rng = random.Random(0)
    items = [SaveItem((f"op{i}#0",), rng.randint(1, 100), rng.random()) for i in range(14)]
    full = frontier(items)
    thin = frontier(items, max_points=5)
    assert len(thin) == 5 and thin[0] == full[0] and thin[-1] == full[-1]


@pytest.fixture(scope="module")
def gpt_profile():
    return profile_model(load_model_file(ROOT / "sample_models" / "gpt.py"), Settings(batch_size=1))


def record(op: str, size: int, time: float, **flags) -> OpRecord:
    fields = {"random": False, "inplace": False, "mutated_later": False, **flags}
    return OpRecord(op, "fwd:0", "blocks.0", False, size, 0, 0.0, time, **fields)


def test_save_items_name_calls_and_group_random_ops() -> None:
    ops = [
        record("aten.addmm.default", 40, 5.0),
        record("aten.empty_like.default", 10, 0.0, mutated_later=True),
        record("aten.bernoulli_.float", 10, 0.1, random=True, inplace=True),
        record("aten.native_dropout.default", 50, 0.2, random=True),
        record("aten.addmm.default", 40, 5.0),
        record("aten.rand.default", 8, 0.1, random=True),
    ]
    items = save_items([op for op in ops if not op.inplace])
    assert [i.ops for i in items] == [
        ("aten.addmm.default#0",),
        ("aten.addmm.default#1",),
        ("aten.native_dropout.default#0", "aten.rand.default#0"),
    ]
    assert items[-1].output_bytes == 58
    # An in-place random op cannot be cached, so no random op may be: the RNG replays all.
    assert [i.ops for i in save_items(ops)] == [
        ("aten.addmm.default#0",),
        ("aten.addmm.default#1",),
    ]


def test_block_menus_keep_matmuls_first(gpt_profile) -> None:
    menus = selective_menus(gpt_profile)
    assert len(menus) == len(gpt_profile.blocks) and menus[0]
    assert all(m == menus[1] for m in menus[1:])  # repeated blocks: one menu
    assert all("#" in op for option in menus[0] for op in option.saved)
    output = next(o.op for o in reversed(gpt_profile.ops) if o.phase == "fwd:0")
    paid = [option for option in menus[0] if any(not op.startswith(output) for op in option.saved)]
    assert any("addmm" in op for op in paid[0].saved), "the cheapest op to keep is a matmul"
    kept = [s.kept_bytes for s in menus[0]]
    assert kept == sorted(kept)
    assert menus[0][-1].recompute_time < menus[0][0].recompute_time


@pytest.mark.parametrize("policy_op_time", [0.0, 1e-3])
def test_menu_options_pay_for_every_op_they_do_not_keep(gpt_profile, policy_op_time) -> None:
    """In-place ops (dropout's ``bernoulli_`` on CPU), views and the random ops they force to
    replay run again under every option; each op call also pays the policy's dispatch."""
    profile = replace(gpt_profile, policy_op_time=policy_op_time)
    ops = block_forward_ops(profile)[0]
    assert any(op.inplace and op.random for op in ops), "CPU dropout draws its mask in place"
    by_name = dict(zip(op_names(ops), ops, strict=True))
    dispatch = 2 * len(ops) * policy_op_time
    for option in selective_menus(profile)[0]:
        assert not any(by_name[n].random for n in option.saved)
        not_kept = sum(op.time for n, op in by_name.items() if n not in option.saved)
        assert option.recompute_time == pytest.approx(not_kept + dispatch, rel=1e-9)


def test_auto_never_loses_to_dp(gpt_profile) -> None:
    chain = to_chain(gpt_profile, menus=selective_menus(gpt_profile))
    none, full = run_solver("none", chain, None), run_solver("full", chain, None)
    for f in (0.05, 0.3, 0.6, 0.9):
        budget = int(full.peak + f * (none.peak - full.peak))
        dp, auto = run_solver("dp", chain, budget), run_solver("auto", chain, budget)
        assert auto.peak <= budget
        assert auto.recompute_time <= dp.recompute_time + 1e-12
    mid = int(full.peak + 0.6 * (none.peak - full.peak))
    free = replace(gpt_profile, policy_op_time=0.0)
    assert run_solver("auto", to_chain(free, menus=selective_menus(free)), mid).options
    dear = replace(gpt_profile, policy_op_time=1.0)
    assert not run_solver("auto", to_chain(dear, menus=selective_menus(dear)), mid).options


def test_selective_plans_keep_gradients_and_fit(tmp_path) -> None:
    """Auto's selective plan itself, priced with no policy cost so that it keeps op outputs
    (``solve`` on the CPU takes the segments-only plan unless a selective one wins by 3% of
    the step), fake-run and measured."""
    model = ROOT / "sample_models" / "gpt.py"
    profile = replace(ckptplan.profile(model, batch_size=1), policy_op_time=0.0)
    menus = selective_menus(profile)
    chain = to_chain(profile, menus=menus)
    budget = int(0.6 * run_solver("none", chain, None).peak)
    schedule = run_solver("auto", chain, budget)
    plan = plan_from_schedule(profile, chain, schedule, ResolvedBudget("0.6", budget), menus)
    peak = fake_run_peak(load_model_file(model), plan)
    plan = replace(plan, predicted=replace(plan.predicted, fake_run_peak_bytes=peak))
    assert any(r.policy for r in plan.regions)
    result = ckptplan.verify(model, plan, repeats=1)
    assert result.max_grad_abs_diff <= 1e-6
    assert result.measured_peak_bytes <= plan.budget.bytes
    assert abs(result.measured_peak_bytes - plan.predicted.fake_run_peak_bytes) <= (
        0.01 * result.measured_peak_bytes
    )


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[str(func)] += 1
        return func(*args, **(kwargs or {}))


def backward_ops(model_file, model) -> Counter[str]:
    torch.manual_seed(0)
    loss = model_file.loss(model(*model_file.inputs(2)))
    counter = _OpCounter()
    with counter:
        loss.backward()
    return counter.calls


def test_saved_ops_are_not_rerun_in_backward_and_the_others_are(tiny_gpt) -> None:
    model_file = load_model_file(tiny_gpt)
    plan = ckptplan.solve(tiny_gpt, budget="1.0", solver="none", batch_size=2, fake_run=False)

    def applied(policy):
        data = {**plan.to_json(), "regions": [{"modules": ["layers.2"], "policy": policy}]}
        return ckptplan.apply(model_file.build().train(), Plan.from_json(data))

    plain = backward_ops(model_file, model_file.build().train())
    full = backward_ops(model_file, applied(None))
    selective = backward_ops(model_file, applied({"save": ["aten.addmm.default"]}))
    recomputed = full["aten.addmm.default"] - plain["aten.addmm.default"]
    assert recomputed > 0, "a checkpointed block re-runs its matmuls in backward"
    assert selective["aten.addmm.default"] == plain["aten.addmm.default"], "saved: not re-run"
    assert selective["aten.gelu.default"] == full["aten.gelu.default"] > plain["aten.gelu.default"]


@settings(max_examples=60, deadline=None)
@given(
    raw=st.lists(
        st.tuples(st.integers(1, 50), st.floats(0.01, 5.0), st.floats(0.01, 5.0)),
        min_size=1,
        max_size=7,
    ),
    limit=st.integers(0, 250),
)
def test_frontier_with_offload_is_the_exact_optimum(raw, limit) -> None:
    """Each output kept, recomputed or offloaded: brute force over all 3^n choices."""
    items = [SaveItem((f"op{i}#0",), size, t, offload_time=o) for i, (size, t, o) in enumerate(raw)]
    best = min(
        sum(
            0.0 if c == "keep" else t if c == "recompute" else o
            for c, (_, t, o) in zip(choice, raw, strict=True)
        )
        for choice in itertools.product(("keep", "recompute", "offload"), repeat=len(raw))
        if sum(size for c, (size, _, _) in zip(choice, raw, strict=True) if c == "keep") <= limit
    )
    points = [p for p in frontier(items) if p.kept_bytes <= limit]
    assert min(p.recompute_time for p in points) == pytest.approx(best, abs=1e-9)
    for p in frontier(items):
        assert not set(p.saved) & set(p.offloaded)
        cost = sum(
            0.0 if item.ops[0] in p.saved else o if item.ops[0] in p.offloaded else t
            for item, (_, t, o) in zip(items, raw, strict=True)
        )
        assert p.recompute_time == pytest.approx(cost, abs=1e-9)
        moved = sum(item.output_bytes for item in items if item.ops[0] in p.offloaded)
        assert p.offloaded_bytes == moved


def test_menus_offload_only_where_there_is_a_host(gpt_profile) -> None:
    from dataclasses import replace

    assert not any(s.offloaded for menu in selective_menus(gpt_profile) for s in menu)
    on_gpu = replace(gpt_profile, settings=replace(gpt_profile.settings, device="l4"))
    # Measured CPU op times against an L4's host link: large cheap-to-move outputs go to host.
    assert any(s.offloaded for menu in selective_menus(on_gpu) for s in menu)


def test_offloaded_ops_are_not_rerun_and_gradients_match(tiny_gpt) -> None:
    model_file = load_model_file(tiny_gpt)
    plan = ckptplan.solve(tiny_gpt, budget="1.0", solver="none", batch_size=2, fake_run=False)
    data = {
        **plan.to_json(),
        "regions": [
            {
                "modules": ["layers.1"],
                "policy": {"save": ["aten.gelu.default#0"], "offload": ["aten.addmm.default"]},
            }
        ],
    }
    offloading = Plan.from_json(data)
    plain = backward_ops(model_file, model_file.build().train())
    moved = backward_ops(model_file, ckptplan.apply(model_file.build().train(), offloading))
    assert moved["aten.addmm.default"] == plain["aten.addmm.default"], "offloaded: not re-run"
    assert moved["aten.gelu.default"] == plain["aten.gelu.default"], "saved: not re-run"
    assert moved["aten.native_layer_norm.default"] > plain["aten.native_layer_norm.default"]
    result = ckptplan.verify(tiny_gpt, offloading, repeats=1)
    assert result.max_grad_abs_diff <= 1e-6


def test_a_fake_run_counts_offloaded_outputs_off_the_device(tiny_gpt) -> None:
    """The fake run models a device with a host link: offloaded outputs leave device memory."""
    from ckptplan.stepping.fakerun import fake_run_peak

    model_file = load_model_file(tiny_gpt)
    plan = ckptplan.solve(tiny_gpt, budget="1.0", solver="none", batch_size=2, fake_run=False)
    blocks = [f"layers.{i}" for i in range(4)]

    def peak(key: str) -> int:
        regions = [{"modules": [b], "policy": {key: ["aten.addmm.default"]}} for b in blocks]
        return fake_run_peak(model_file, Plan.from_json({**plan.to_json(), "regions": regions}))

    assert peak("offload") < peak("save")


def test_a_policy_cannot_both_save_and_offload_an_op(tiny_gpt) -> None:
    plan = ckptplan.solve(tiny_gpt, budget="1.0", solver="none", batch_size=2, fake_run=False)
    op = "aten.addmm.default#0"
    region = {"modules": ["layers.1"], "policy": {"save": [op], "offload": [op]}}
    with pytest.raises(ckptplan.CkptplanError, match="both saves and offloads"):
        Plan.from_json({**plan.to_json(), "regions": [region]})


def test_the_rewriter_refuses_offload_with_a_pointer_to_apply(tiny_gpt) -> None:
    plan = ckptplan.solve(tiny_gpt, budget="1.0", solver="none", batch_size=2, fake_run=False)
    region = {"modules": ["layers.1"], "policy": {"offload": ["aten.addmm.default#0"]}}
    offloading = Plan.from_json({**plan.to_json(), "regions": [region]})
    with pytest.raises(ckptplan.CkptplanError, match=r"ckptplan\.apply"):
        ckptplan.rewrite(load_model_file(tiny_gpt).build(), offloading)


def test_a_segment_of_blocks_under_one_policy_is_predicted_and_exact() -> None:
    """Two blocks in one region, each keeping its matmul: the region's policy counts calls
    across both blocks, the fake run confirms the chain's peak, gradients match."""
    from ckptplan.planning.schedule_plan import plan_from_schedule
    from ckptplan.solvers.chain import simulate
    from ckptplan.stepping.fakerun import fake_run_peak

    model = ROOT / "sample_models" / "mlp.py"
    profile = replace(ckptplan.profile(model, batch_size=8), policy_op_time=0.0)
    menus = selective_menus(profile)
    chain = to_chain(profile, menus=menus)
    option = next(i for i, s in enumerate(menus[1]) if "aten.addmm.default#0" in s.saved)
    schedule = simulate(chain, [(1, 3)], options=[(1, option), (2, option)])
    plan = plan_from_schedule(
        profile, chain, schedule, ResolvedBudget("test", schedule.peak), menus
    )
    (region,) = plan.regions
    assert region.modules == (profile.blocks[1].path, profile.blocks[2].path)
    assert {"aten.addmm.default#0", "aten.addmm.default#1"} <= set(map(str, region.policy.saves))
    assert schedule.recompute_time < simulate(chain, [(1, 3)]).recompute_time
    assert fake_run_peak(load_model_file(model), plan) == pytest.approx(schedule.peak, rel=1e-3)
    assert ckptplan.verify(model, plan, repeats=1).max_grad_abs_diff <= 1e-6


def test_kept_outputs_past_the_last_save_stay_through_backward(gpt_profile) -> None:
    """Recomputation stops at a block's last saved tensor, so a cached output of an op after
    it (the residual add that makes the block's output) is never taken back: the chain counts
    it through the block's backward, and the fake run agrees."""
    from ckptplan.planning.schedule_plan import plan_from_schedule
    from ckptplan.solvers.chain import simulate
    from ckptplan.stepping.fakerun import fake_run_peak

    menus = selective_menus(gpt_profile)
    chain = to_chain(gpt_profile, menus=menus)
    segments = [(k, k + 1) for k in range(len(chain.blocks))]
    workload = load_model_file(ROOT / "sample_models" / "gpt.py")
    held = [i for i, o in enumerate(chain.blocks[0].options) if o.held_bytes][:3]
    assert held, "the residual add comes after the block's last save"
    backward_peaks = 0
    for index in held:
        schedule = simulate(chain, segments, options=[(k, index) for k in range(len(segments))])
        plan = plan_from_schedule(
            gpt_profile, chain, schedule, ResolvedBudget("t", schedule.peak), menus
        )
        fake = fake_run_peak(workload, plan)
        assert fake <= schedule.peak * 1.001
        if not schedule.peak_event.startswith("forward"):
            backward_peaks += 1
            assert fake == pytest.approx(schedule.peak, rel=1e-3)
    assert backward_peaks


@pytest.mark.parametrize(
    ("selective", "segments", "slack", "taken"),
    [
        (1.00, 1.02, 0.03, False),
        (1.00, 1.05, 0.03, True),
        (1.0, 1.0, 0.0, False),
        (1.0, 1.1, 0.0, True),
    ],
)
def test_a_selective_plan_is_taken_only_by_more_than_the_slack(
    selective: float, segments: float, slack: float, taken: bool
) -> None:
    assert selective_pays(selective, segments, 1.0, slack) is taken


def test_auto_takes_dp_plan_where_its_selective_one_saves_under_the_margin() -> None:
    """At 70% of ViT's unchecked peak, auto's own plan keeps one block's op outputs for about
    1% of the step less recompute than dp's plan: under the CPU's 3%, so auto returns dp's."""
    model = ROOT / "sample_models" / "vit.py"
    auto = ckptplan.solve(model, budget="70%", solver="auto")
    segments = ckptplan.solve(model, budget="70%", solver="dp")
    assert auto.solver == "auto"
    assert [r.to_json() for r in auto.regions] == [r.to_json() for r in segments.regions]
    assert not any(r.policy for r in auto.regions)


def test_two_plans_are_timed_in_interleaved_rounds() -> None:
    """The A/B instrument of ``benchmarks/auto_vs_dp.py``: one time per plan per round."""
    from ckptplan.verifying.pairtiming import interleaved_step_times

    tiny = ROOT / "tests" / "models" / "tiny_gpt.py"
    plans = {
        name: ckptplan.solve(tiny, budget="1.0", solver=name, batch_size=2)
        for name in ("full", "none")
    }
    times = interleaved_step_times(load_model_file(tiny), plans, repeats=3)
    assert {k: len(v) for k, v in times.items()} == {"full": 3, "none": 3}
    assert all(t > 0 for v in times.values() for t in v)
    with pytest.raises(ckptplan.CkptplanError, match="at least one step"):
        interleaved_step_times(load_model_file(tiny), plans, repeats=0)


def test_identical_blocks_share_one_menu() -> None:
    menus = selective_menus(
        ckptplan.profile(ROOT / "tests" / "models" / "hf_llama.py", batch_size=2)
    )
    assert len(menus) == 4 and all(menus)
    assert menus[1] is menus[2], "repeated layers are priced once"
