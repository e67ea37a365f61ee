"""A module that runs several times in one forward is planned call by call.

ALBERT runs one shared layer group once per layer, SimCLR one backbone once per view: each call
is a unit (``ckptplan.values.unit_names``), the solver chooses per call, and ``apply`` checkpoints
exactly the planned calls, counted per forward of the model (``ckptplan.applying.calls``).
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

import ckptplan
from ckptplan.errors import BelowLeastPeak, CkptplanError
from ckptplan.loading import load_model_file
from ckptplan.profiling.steptiming import checkpointed
from ckptplan.profiling.training import make_optimizer
from ckptplan.stepping.steppeak import StepRun, measured_peak
from ckptplan.values.plan import Plan, Region
from tests.conftest import ROOT

pytestmark = pytest.mark.runtime  # run on the lowest and newest torch supported too (.ci/run)

ALBERT = ROOT / "tests" / "models" / "tiny_albert.py"
ZOO = ROOT / "sample_models" / "zoo"
GROUP = "albert.encoder.albert_layer_groups.0"


class SharedMLP(nn.Module):
    """One block run ``depth`` times (a Universal Transformer's recurrent depth, in small)."""

    def __init__(self, depth: int = 4) -> None:
        super().__init__()
        self.depth = depth
        self.inp = nn.Linear(16, 32)
        self.block = nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 32))
        self.out = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for _ in range(self.depth):
            h = self.block(h)
        return self.out(h).sum()


def _shared_mlp() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return SharedMLP(), torch.randn(256, 16)


def _plan_of(model: nn.Module, batch: torch.Tensor, *regions: Region) -> Plan:
    """A plan for ``model`` with the given regions (the solver's own are replaced)."""
    plan = ckptplan.solve(model, (batch,), budget="100%", solver="none", fake_run=False)
    return replace(plan, regions=regions)


def _gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_each_call_of_a_shared_module_is_a_unit() -> None:
    profile = ckptplan.profile(ALBERT)
    assert [b.path for b in profile.blocks] == [f"{GROUP}#{k}" for k in range(4)]
    assert all(b.joins_previous for b in profile.blocks[1:])


def test_blocks_may_name_a_module_that_runs_several_times() -> None:
    profile = ckptplan.profile(ALBERT, blocks="*.albert_layers.0")
    assert [b.path for b in profile.blocks] == [f"{GROUP}.albert_layers.0#{k}" for k in range(4)]


def test_a_plan_of_calls_fits_its_budget_with_the_unchecked_gradients() -> None:
    plan = ckptplan.solve(ALBERT, budget="70%")
    assert any(region.calls for region in plan.regions)
    check = ckptplan.verify(ALBERT, plan, repeats=1)
    assert check.measured_peak_bytes <= plan.budget.bytes
    assert check.max_grad_abs_diff <= 1e-6


def _every_call_checkpointed_peak(model_file: Path, modules: tuple[str, ...]) -> int:
    """The allocator's peak of the step with torch's checkpoint around each of ``modules``'
    forward, so around every call of it."""
    workload = load_model_file(model_file)
    torch.manual_seed(0)
    model, inputs = workload.build().train(), workload.inputs()
    with checkpointed([(path, model.get_submodule(path)) for path in modules], None):
        run = StepRun(model, make_optimizer("adamw", model), inputs)
        return measured_peak(workload, run, torch.device("cpu"))[0]


def _least_peak(model_file: Path) -> int:
    with pytest.raises(BelowLeastPeak) as refused:
        ckptplan.solve(model_file, budget="1", solver="dp")
    return refused.value.least_bytes


def test_the_least_peak_is_at_most_checkpointing_every_call() -> None:
    """ALBERT in transformers 5 has no gradient checkpointing of its own (no checkpointing
    layer), so the baseline is torch's checkpoint around the layer group: every call."""
    assert _least_peak(ALBERT) <= _every_call_checkpointed_peak(ALBERT, (GROUP,))


def test_each_view_of_a_two_view_step_is_its_own_units() -> None:
    units = [b.path for b in ckptplan.profile(ZOO / "simclr_two_view.py", batch_size=4).blocks]
    view = ["stem", *(f"blocks.{i}" for i in range(4)), "head"]
    assert units == [f"{u}#0" for u in view] + [f"{u}#1" for u in view]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "modules"),
    [
        ("hf_albert", (GROUP,)),
        ("simclr_two_view", ("stem", *(f"blocks.{i}" for i in range(4)), "head")),
    ],
)
def test_zoo_plans_of_calls_reach_checkpointing_every_call_and_fit(
    name: str, modules: tuple[str, ...]
) -> None:
    model_file = ZOO / f"{name}.py"
    assert _least_peak(model_file) <= _every_call_checkpointed_peak(model_file, modules)
    for budget in ("80%", "60%", "40%"):
        plan = ckptplan.solve(model_file, budget=budget)
        check = ckptplan.verify(model_file, plan, repeats=1)
        assert check.measured_peak_bytes <= plan.budget.bytes, budget
        assert check.max_grad_abs_diff <= 1e-6, budget


def test_apply_checkpoints_exactly_the_planned_calls_step_after_step() -> None:
    model, batch = _shared_mlp()
    reference = copy.deepcopy(model)
    plan = _plan_of(model, batch, Region(("block",), calls=(1,)), Region(("block",), calls=(3,)))
    planned = ckptplan.apply(model, plan)
    for _ in range(3):
        planned.zero_grad(set_to_none=True)
        planned(batch).backward()
    stats = planned.ckptplan_applied.stats
    assert [(s.name, s.forwards, s.recomputes) for s in stats] == [
        ("block#1", 3, 3),
        ("block#3", 3, 3),
    ]
    reference(batch).backward()
    for name, grad in _gradients(reference).items():
        torch.testing.assert_close(_gradients(planned)[name], grad, atol=1e-6, rtol=0)


def test_calls_joined_in_one_region_run_from_the_first_and_extra_calls_run_unchecked() -> None:
    model, batch = _shared_mlp()
    reference = copy.deepcopy(model)
    plan = _plan_of(model, batch, Region(("block", "block"), calls=(0, 1)))
    planned = ckptplan.apply(model, plan)
    planned.depth = reference.depth = 6  # two calls more than the plan knows of
    planned(batch).backward()
    reference(batch).backward()
    assert [(s.forwards, s.recomputes) for s in planned.ckptplan_applied.stats] == [(1, 1)]
    for name, grad in _gradients(reference).items():
        torch.testing.assert_close(_gradients(planned)[name], grad, atol=1e-6, rtol=0)


def test_a_shared_batchnorm_checkpointed_in_its_second_call_keeps_exact_gradients() -> None:
    """Recomputing the second view's block puts the BatchNorm statistics back as its forward
    left them, without a new version of them: the first view's unchecked call saved them."""
    workload = load_model_file(ZOO / "simclr_two_view.py")
    torch.manual_seed(0)
    model, views = workload.build(), workload.inputs(4)
    reference = copy.deepcopy(model)
    plan = ckptplan.solve(
        model, views, budget="100%", solver="none", fake_run=False, loss_fn=workload.loss
    )
    regions = (Region(("blocks.1",), calls=(1,)), Region(("blocks.2",), calls=(0,)))
    planned = ckptplan.apply(model, replace(plan, regions=regions))
    workload.loss(planned(*views)).backward()
    workload.loss(reference(*views)).backward()
    for name, grad in _gradients(reference).items():
        torch.testing.assert_close(_gradients(planned)[name], grad, atol=1e-6, rtol=0)
    for name, buffer in reference.named_buffers():
        torch.testing.assert_close(planned.get_buffer(name), buffer, atol=0, rtol=0)


def test_a_planned_model_compiles_once() -> None:
    """The call count is reset by the root's pre-hook before any call reads it, so dynamo
    never guards on the count the previous step left."""
    from torch._dynamo.testing import CompileCounterWithBackend

    model, batch = _shared_mlp()
    reference = copy.deepcopy(model)
    plan = _plan_of(
        model, batch, Region(("block",), calls=(0,)), Region(("block",) * 2, calls=(2, 3))
    )
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(ckptplan.apply(model, plan), backend=counter)
    for _ in range(4):
        model.zero_grad(set_to_none=True)
        compiled(batch).backward()
    assert counter.frame_count == 1
    reference(batch).backward()
    for name, grad in _gradients(reference).items():
        torch.testing.assert_close(_gradients(model)[name], grad, atol=1e-6, rtol=0)


def test_old_plan_files_name_a_modules_only_call(tmp_path: Path) -> None:
    model, batch = _shared_mlp()
    plan = _plan_of(model, batch, Region(("block", "block"), calls=(2, 3)))
    data = plan.to_json()
    assert data["regions"] == [{"modules": ["block", "block"], "calls": [2, 3]}]
    assert Plan.from_json(json.loads(json.dumps(data))).regions == plan.regions
    data["regions"] = [{"modules": ["inp"]}]  # as every plan before calls were planned
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = Plan.load(tmp_path / "old.json")
    assert old.regions[0].calls == () and old.regions[0].units == ("inp",)
    data["regions"] = [{"modules": ["block"], "calls": [0, 1]}]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(CkptplanError, match="damaged plan"):
        Plan.load(tmp_path / "bad.json")


def test_a_call_planned_twice_is_refused() -> None:
    model, batch = _shared_mlp()
    plan = _plan_of(model, batch, Region(("block",), calls=(1,)), Region(("block",)))
    with pytest.raises(CkptplanError, match="in two regions"):
        ckptplan.apply(model, plan)


class TwoForwards(nn.Module):
    """Calls itself for its second view: the shared block runs in two forwards of the model,
    where a plan's count of calls restarts."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 8))

    def forward(self, x: torch.Tensor, second: bool = True) -> torch.Tensor:
        out = self.block(x).sum()
        return out + self(x.flip(0), second=False) if second else out


def test_a_module_run_in_two_forwards_of_a_step_is_refused() -> None:
    with pytest.raises(CkptplanError, match="runs in 2 forwards"):
        ckptplan.profile(TwoForwards(), (torch.randn(4, 8),))
