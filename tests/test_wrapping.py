"""Applying plans: identical gradients, real recomputation, and the refusals."""

import collections
import copy
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch

import ckptplan
from ckptplan.errors import CkptplanError
from ckptplan.loading import load_model_file
from ckptplan.values.plan import Plan, Region
from ckptplan.values.policy_types import OpCall, Policy
from tests.conftest import MODELS, ROOT
from tests.test_rewrite import plan_for

pytestmark = pytest.mark.runtime  # run on the lowest and newest torch supported too (.ci/run)


@pytest.fixture(scope="module")
def plan() -> Plan:
    return ckptplan.solve(MODELS / "tiny_gpt.py", budget="1.0", solver="none", batch_size=2)


def with_regions(plan: Plan, *regions: tuple[str, ...]) -> Plan:
    return Plan.from_json({**plan.to_json(), "regions": [{"modules": list(r)} for r in regions]})


def step(model_file, model, seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(123)
    inputs = model_file.inputs(2)
    torch.manual_seed(seed)
    model_file.loss(model(*inputs)).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "regions",
    [
        [("layers.0",), ("layers.3",)],
        [("layers.0", "layers.1", "layers.2"), ("layers.3", "layers.4", "layers.5")],
        [("layers.1", "layers.2", "layers.3", "layers.4")],
    ],
)
def test_gradients_equal_the_unchecked_model_with_dropout(tiny_gpt, plan, regions) -> None:
    model_file = load_model_file(tiny_gpt)
    torch.manual_seed(0)
    reference = model_file.build().train()
    planned = ckptplan.apply(copy.deepcopy(reference), with_regions(plan, *regions))
    expected, got = step(model_file, reference), step(model_file, planned)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.allclose(expected[name], got[name], atol=1e-6, rtol=0), name
    # Different dropout masks would change gradients: the comparison can fail.
    other = step(model_file, reference, seed=1)
    assert any(not torch.allclose(expected[n], other[n]) for n in expected)


def test_checkpointed_blocks_are_recomputed_and_others_are_not(tiny_gpt, plan) -> None:
    model_file = load_model_file(tiny_gpt)
    model = model_file.build().train()
    ckptplan.apply(model, with_regions(plan, ("layers.1", "layers.2")))
    calls = {f"layers.{i}": 0 for i in range(6)}
    for i in range(6):
        name = f"layers.{i}"
        model.layers[i].mlp.register_forward_hook(
            lambda *_, name=name: calls.__setitem__(name, calls[name] + 1)
        )
    step(model_file, model)
    assert calls == {
        "layers.0": 1,
        "layers.1": 2,
        "layers.2": 2,
        "layers.3": 1,
        "layers.4": 1,
        "layers.5": 1,
    }


def test_apply_reports_what_it_wrapped(tiny_gpt, plan) -> None:
    model = load_model_file(tiny_gpt).build()
    planned = with_regions(plan, ("layers.0", "layers.1"), ("layers.4",))
    assert ckptplan.apply(model, planned) is model
    assert model.ckptplan_applied.regions == (("layers.0", "layers.1"), ("layers.4",))
    assert "2 regions" in str(model.ckptplan_applied)
    assert set(model.state_dict()) == set(load_model_file(tiny_gpt).build().state_dict())


def test_apply_refuses_to_wrap_twice(tiny_gpt, plan) -> None:
    model = load_model_file(tiny_gpt).build()
    ckptplan.apply(model, with_regions(plan, ("layers.0",)))
    with pytest.raises(CkptplanError, match="already checkpointed"):
        ckptplan.apply(model, with_regions(plan, ("layers.0",)))


def test_apply_refuses_another_model_unless_forced(tiny_gpt, plan) -> None:
    from tests.models.tiny_gpt import TinyGPT

    other = TinyGPT(width=48)
    with pytest.raises(CkptplanError, match="made for another model") as info:
        ckptplan.apply(other, with_regions(plan, ("layers.0",)))
    assert "\n" not in str(info.value)
    ckptplan.apply(other, with_regions(plan, ("layers.0",)), force=True)
    assert other.ckptplan_applied is not None


def test_a_copy_of_an_applied_model_is_independent(tiny_gpt, plan) -> None:
    model_file = load_model_file(tiny_gpt)
    torch.manual_seed(0)
    model = ckptplan.apply(model_file.build().train(), with_regions(plan, ("layers.0", "layers.1")))
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for p in clone.parameters():
            p.mul_(0.5)
    a, b = step(model_file, model), step(model_file, clone)
    assert any(not torch.allclose(a[n], b[n]) for n in a)


def test_plan_round_trips_through_json(tmp_path, plan) -> None:
    planned = with_regions(plan, ("layers.0", "layers.1"))
    planned.save(tmp_path / "plan.json")
    loaded = Plan.load(tmp_path / "plan.json")
    assert loaded == planned
    assert loaded.regions == (Region(("layers.0", "layers.1")),)


def test_a_file_that_is_not_a_plan(tmp_path) -> None:
    (tmp_path / "x.json").write_text('{"schema": "other"}')
    with pytest.raises(CkptplanError, match="not a ckptplan plan"):
        Plan.load(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("{nope")
    with pytest.raises(CkptplanError, match="not valid JSON"):
        Plan.load(tmp_path / "y.json")


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Small ops: a second intra-op thread only spin-waits on a busy two-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Shift(torch.nn.Module):
    """Saves nothing for backward, so checkpointing it recomputes nothing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


class Normed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.norm = torch.nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.norm(self.fc(x)))


class Collecting(torch.nn.Module):
    """Uses every block's output, not only the last one (like U-Net skips)."""

    def __init__(self, blocks: list[torch.nn.Module]) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        return sum(o.square().sum() for o in outs)


def toy_grads(model: torch.nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    model(torch.randn(4, 8)).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same_grads(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-6, rtol=0), name


def test_the_first_backward_reports_what_was_recomputed(tiny_gpt, plan, caplog) -> None:
    model_file = load_model_file(tiny_gpt)
    model = model_file.build().train()
    ckptplan.apply(model, with_regions(plan, ("layers.0", "layers.1"), ("layers.3",)))
    assert model.ckptplan_applied.first_backward is None
    with caplog.at_level(logging.INFO, logger="ckptplan"):
        step(model_file, model)
    report = "the first backward recomputed 2 of 2 checkpointed regions"
    assert report in model.ckptplan_applied.first_backward
    assert any(report in r.message for r in caplog.records)
    assert model.ckptplan_applied.recomputed == 2
    step(model_file, model)
    assert model.ckptplan_applied.recomputed == 4
    assert [s.recomputes for s in model.ckptplan_applied.stats] == [2, 2]


def test_solve_keeps_the_report_of_its_fake_runs_off_the_log(tiny_gpt, caplog) -> None:
    """The fake run applies the plan: its ``checkpointed N regions`` report would repeat, per
    candidate, what the user's own ``apply`` says once."""
    with caplog.at_level(logging.INFO, logger="ckptplan"):
        plan = ckptplan.solve(tiny_gpt, budget="1.0", solver="full", batch_size=2)
        assert caplog.records == []
        model_file = load_model_file(tiny_gpt)
        step(model_file, ckptplan.apply(model_file.build().train(), plan))
    reports = [r.message for r in caplog.records]
    assert len(reports) == 2, reports
    assert "checkpointed 6 regions" in reports[0] and "first backward" in reports[1]


def test_a_region_that_is_never_recomputed_is_a_warning(caplog) -> None:
    model = Collecting([torch.nn.Linear(8, 8), Shift(), torch.nn.Linear(8, 8)])
    ckptplan.apply(model, plan_for(model, [{"modules": ["blocks.1"]}]))
    with caplog.at_level(logging.WARNING, logger="ckptplan"):
        toy_grads(model)
    assert "never recomputed: blocks.1" in caplog.text


def test_the_report_waits_for_a_region_whose_input_needs_no_gradient() -> None:
    """The first region's input is the data: its call finishes when its parameters' gradients
    do, after its recomputation (Note [the end of the first backward])."""
    model = Collecting([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)])
    ckptplan.apply(model, plan_for(model, [{"modules": ["blocks.0"]}, {"modules": ["blocks.1"]}]))
    toy_grads(model)
    assert "recomputed 2 of 2 checkpointed regions" in model.ckptplan_applied.first_backward


class Unused(torch.nn.Module):
    """Runs its second block on the data, and leaves its output out of the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.blocks[1](x)
        return self.blocks[0](x).square().sum()


def test_a_region_no_backward_reaches_is_reported_at_the_next_step(caplog) -> None:
    model = Unused()
    ckptplan.apply(model, plan_for(model, [{"modules": ["blocks.0"]}, {"modules": ["blocks.1"]}]))
    model(torch.randn(4, 8)).backward()
    assert model.ckptplan_applied.first_backward is None
    with caplog.at_level(logging.WARNING, logger="ckptplan"):
        model(torch.randn(4, 8))
    assert "recomputed 1 of 2" in model.ckptplan_applied.first_backward
    assert "never recomputed: blocks.1" in caplog.text


def test_every_member_of_a_region_returns_its_own_output() -> None:
    """A region of three blocks whose outputs are all used later: each member's output reaches
    the loss as its own (the gradients), and the members run again in backward, once. The last
    runs once only: what its backward needs is its input, and torch's checkpoint stops
    recomputing when it has every tensor the region saved (early stop)."""
    torch.manual_seed(0)
    reference = Collecting([torch.nn.Linear(8, 8) for _ in range(4)])
    model = copy.deepcopy(reference)
    ckptplan.apply(model, plan_for(model, [{"modules": ["blocks.0", "blocks.1", "blocks.2"]}]))
    runs: collections.Counter[str] = collections.Counter()
    for name, block in model.named_modules():
        if isinstance(block, torch.nn.Linear):
            block.register_forward_hook(lambda *_, name=name: runs.update([name]))
    assert_same_grads(toy_grads(reference), toy_grads(model))
    assert runs == {"blocks.0": 2, "blocks.1": 2, "blocks.2": 1, "blocks.3": 1}
    assert model.ckptplan_applied.recomputed == 1


def test_batchnorm_statistics_are_updated_once_per_step() -> None:
    torch.manual_seed(0)
    reference = Collecting([Normed() for _ in range(3)]).train()
    model = copy.deepcopy(reference)
    ckptplan.apply(model, plan_for(model, [{"modules": ["blocks.0", "blocks.1"]}]))
    assert_same_grads(toy_grads(reference), toy_grads(model))
    assert model.ckptplan_applied.recomputed == 1
    for (name, a), b in zip(reference.named_buffers(), model.buffers(), strict=True):
        assert torch.equal(a, b), name


def test_a_second_backward_of_one_forward_recomputes_again() -> None:
    """``retain_graph``: the region's recompute context is entered once per backward, each
    time putting back the BatchNorm statistics (Note [knowing a recomputation])."""
    torch.manual_seed(0)
    reference = Collecting([Normed() for _ in range(3)]).train()
    model = copy.deepcopy(reference)
    ckptplan.apply(model, plan_for(model, [{"modules": ["blocks.0", "blocks.1"]}]))
    x = torch.randn(4, 8)
    grads = []
    for net in (reference, model):
        out = net(x)
        out.backward(retain_graph=True)
        out.backward()
        grads.append({n: p.grad.clone() for n, p in net.named_parameters()})
    assert_same_grads(*grads)
    assert model.ckptplan_applied.recomputed == 2
    for (name, a), b in zip(reference.named_buffers(), model.buffers(), strict=True):
        assert torch.equal(a, b), name


def test_a_selective_policy_keeps_the_gradients(tiny_gpt, plan) -> None:
    model_file = load_model_file(tiny_gpt)
    torch.manual_seed(0)
    reference = model_file.build().train()
    regions = [
        {"modules": ["layers.1"], "policy": {"save": ["aten.addmm.default#1", "aten.bmm.default"]}},
        {
            "modules": ["layers.2", "layers.3"],
            "policy": {"save": ["aten.native_layer_norm.default"]},
        },
    ]
    planned = Plan.from_json({**plan.to_json(), "regions": regions})
    model = ckptplan.apply(copy.deepcopy(reference), planned)
    assert "selective: layers.1 keeps 2 op outputs; layers.2+layers.3 keeps 1 op output" in str(
        model.ckptplan_applied
    )
    expected, got = step(model_file, reference), step(model_file, model)
    assert_same_grads(expected, got)


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"discard": ["aten.mm.default"]}, "ckptplan supports save, offload"),
        ({"save": ["mm"]}, "namespace.op.overload"),
        ({"save": ["aten.mm.default#x"]}, "write op#k"),
        ({"save": "aten.mm.default"}, "write a list of op calls"),
        ({"save": [3]}, "name op calls as strings"),
        (["aten.mm.default"], "policy of layers.0 is a list"),
    ],
)
def test_a_malformed_policy_is_a_one_line_error_when_the_plan_loads(plan, policy, message) -> None:
    data = {**plan.to_json(), "regions": [{"modules": ["layers.0"], "policy": policy}]}
    with pytest.raises(CkptplanError, match=message) as info:
        Plan.from_json(data)
    assert "\n" not in str(info.value)


def test_policies_load_typed_and_the_plan_file_round_trips_unchanged(plan, tmp_path) -> None:
    mlp = {"modules": ["layers.3.mlp"], "policy": {"save": ["aten.mm.default#2"]}}
    regions = [
        {"modules": ["layers.0"], "policy": {"save": ["aten.addmm.default#1", "aten.bmm.default"]}},
        {
            "modules": ["layers.1", "layers.2"],
            "policy": {"save": [], "offload": ["aten.gelu.default#0"]},
        },
        {"modules": ["layers.3"], "children": [mlp]},
    ]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**plan.to_json(), "regions": regions}, indent=2) + "\n")
    loaded = Plan.load(path)
    assert loaded.regions[0].policy == Policy(
        (OpCall("aten.addmm.default", 1), OpCall("aten.bmm.default"))
    )
    assert loaded.regions[1].policy == Policy((), (OpCall("aten.gelu.default", 0),))
    loaded.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == path.read_text()


def test_a_policy_naming_no_torch_op_is_a_one_line_error_when_applied(tiny_gpt, plan) -> None:
    policy = {"save": ["aten.no_such_op.default"]}
    planned = Plan.from_json(
        {**plan.to_json(), "regions": [{"modules": ["layers.0"], "policy": policy}]}
    )
    with pytest.raises(CkptplanError, match="which is no torch op") as info:
        ckptplan.apply(load_model_file(tiny_gpt).build(), planned)
    assert "\n" not in str(info.value)


def test_nested_regions_run_inside_their_region(tiny_gpt, plan) -> None:
    model_file = load_model_file(tiny_gpt)
    torch.manual_seed(0)
    reference = model_file.build().train()
    regions = [
        {"modules": ["layers.0", "layers.1", "layers.2"], "children": [{"modules": ["layers.1"]}]},
        {"modules": ["layers.4"], "children": [{"modules": ["layers.4.mlp"]}]},
    ]
    model = ckptplan.apply(
        copy.deepcopy(reference), Plan.from_json({**plan.to_json(), "regions": regions})
    )
    assert_same_grads(step(model_file, reference), step(model_file, model))
    applied = model.ckptplan_applied
    assert applied.nested == (("layers.1",), ("layers.4.mlp",))
    assert all(s.recomputes >= 1 for s in applied.nested_stats)


@pytest.mark.parametrize(
    ("regions", "message"),
    [
        ([{"modules": ["layers.0", "layers.1"]}, {"modules": ["layers.1"]}], "in two regions"),
        ([{"modules": ["layers.0", "head"]}], "different parents"),
        ([{"modules": ["layers.0"], "children": [{"modules": ["layers.2"]}]}], "neither a run"),
        ([{"modules": ["layers.0"], "children": [{"modules": ["layers.0"]}]}], "its parent"),
    ],
)
def test_regions_that_cannot_run_are_one_line_errors(tiny_gpt, plan, regions, message) -> None:
    model = load_model_file(tiny_gpt).build()
    with pytest.raises(CkptplanError, match=message):
        ckptplan.apply(model, Plan.from_json({**plan.to_json(), "regions": regions}))


def test_apply_comes_before_compile_and_hugging_face_checkpointing() -> None:
    model = Collecting([torch.nn.Linear(8, 8) for _ in range(2)])
    plan = plan_for(model, [{"modules": ["blocks.0"]}])
    with pytest.raises(CkptplanError, match=r"before torch\.compile"):
        ckptplan.apply(torch.compile(model), plan)
    model.is_gradient_checkpointing = True
    with pytest.raises(CkptplanError, match="gradient_checkpointing_disable"):
        ckptplan.apply(model, plan)


def test_apply_comes_before_ddp_and_fully_shard(tmp_path) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        model = Collecting([torch.nn.Linear(8, 8) for _ in range(2)])
        plan = plan_for(model, [{"modules": ["blocks.0"]}])
        with pytest.raises(CkptplanError, match="before wrapping the model in DDP"):
            ckptplan.apply(torch.nn.parallel.DistributedDataParallel(model), plan)
        fully_shard(model.blocks[1])
        with pytest.raises(CkptplanError, match="before fully_shard"):
            ckptplan.apply(model, plan)
    finally:
        dist.destroy_process_group()


def test_an_applied_model_pickles(tmp_path) -> None:
    torch.manual_seed(0)
    model = Collecting([Normed() for _ in range(3)])
    ckptplan.apply(model, plan_for(model, [{"modules": ["blocks.0", "blocks.1"]}]))
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert_same_grads(toy_grads(model), toy_grads(loaded))
    assert loaded.ckptplan_applied.recomputed == 1
    assert type(loaded.blocks[0]).__name__ == "Normed"


@pytest.mark.parametrize(
    ("script", "arguments"),
    [
        ("train_plain.py", ("--model", str(MODELS / "tiny_gpt.py"), "--batch-size", "2")),
        pytest.param("train_hf.py", ("--batch-size", "2"), marks=pytest.mark.slow),
    ],
)
def test_the_single_process_examples_train_and_report(script, arguments) -> None:
    if script == "train_hf.py":
        pytest.importorskip("transformers")
    command = [sys.executable, str(ROOT / "examples" / script), "--budget", "70%", "--steps", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([*command, *arguments], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the first backward recomputed" in done.stderr
    assert "step 1: loss" in done.stderr
