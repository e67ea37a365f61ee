"""Plan and apply in one call (``ckptplan.autoplan``): identical gradients, a plan cache keyed by
what decides the plan, the caller's state untouched, one-line refusals of bad arguments, and
``apply(model, budget=...)``, its old spelling, still doing the same with a warning."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptplan
from ckptplan import api
from ckptplan.errors import CkptplanError
from ckptplan.loading import load_model_file
from ckptplan.plancache import CACHE_ENV
from ckptplan.values.budget import Budget
from tests.conftest import MODELS, ROOT

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)

TINY_GPT = load_model_file(MODELS / "tiny_gpt.py")


@pytest.fixture
def solves(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The budgets ``api.solve_with`` is called with, in order."""
    calls: list[str] = []
    solve = api.solve_with

    def counted(workload: Any, budget: Budget, *args: Any) -> Any:
        calls.append(budget.text)
        return solve(workload, budget, *args)

    monkeypatch.setattr(api, "solve_with", counted)
    return calls


def build(depth: int = 4) -> torch.nn.Module:
    torch.manual_seed(0)
    return TINY_GPT.module.TinyGPT(depth=depth).train()


def batch() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(123)
    return TINY_GPT.inputs(2)


def gradients(model: torch.nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    inputs = batch()
    torch.manual_seed(seed)
    TINY_GPT.loss(model(*inputs)).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def test_one_call_plans_applies_and_keeps_the_gradients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, solves: list[str]
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    reference = build()
    model = ckptplan.autoplan(copy.deepcopy(reference), batch(), budget="70%")
    applied = model.ckptplan_applied
    assert solves == ["70%"] and applied.regions
    assert len(list((tmp_path / "cache").glob("TinyGPT-*.json"))) == 1
    expected, got = gradients(reference), gradients(model)
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-6, rtol=0, msg=name)
    assert applied.recomputed == len(applied.regions)
    # Dropout is on: other masks would change the gradients, so the comparison can fail.
    other = gradients(build(), seed=1)
    assert any(not torch.equal(expected[name], other[name]) for name in expected)


def test_solving_leaves_the_caller_rng_modes_and_weights_alone(tmp_path: Path) -> None:
    model = build().eval()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    inputs = batch()
    torch.manual_seed(7)
    state = torch.get_rng_state()
    ckptplan.autoplan(model, inputs, budget="70%", cache_dir=tmp_path)
    assert torch.equal(torch.get_rng_state(), state)
    assert model.ckptplan_applied.regions
    assert not any(m.training for m in model.modules())
    after = model.state_dict()
    assert after.keys() == weights.keys()
    assert all(torch.equal(after[k], weights[k]) for k in weights)


def test_the_same_settings_read_the_cache_and_other_ones_solve_again(
    tmp_path: Path, solves: list[str]
) -> None:
    first = ckptplan.autoplan(build(), batch(), budget="70%", cache_dir=tmp_path)
    (cached,) = tmp_path.iterdir()
    written = cached.stat().st_mtime_ns, cached.read_text()
    # The same budget in another spelling is the same plan.
    again = ckptplan.autoplan(build(), batch(), budget=0.7, cache_dir=tmp_path)
    assert solves == ["70%"]
    assert (cached.stat().st_mtime_ns, cached.read_text()) == written
    assert again.ckptplan_applied.regions == first.ckptplan_applied.regions
    gradients(again)
    assert again.ckptplan_applied.recomputed == len(again.ckptplan_applied.regions)

    ckptplan.autoplan(build(), batch(), budget="80%", cache_dir=tmp_path)
    assert solves == ["70%", "80%"]
    assert len(list(tmp_path.iterdir())) == 2


RESTART = """
import logging, sys, torch, ckptplan
from ckptplan.loading import load_model_file
logging.basicConfig(level=logging.INFO, format="%(message)s")
workload = load_model_file(sys.argv[1])
torch.manual_seed(123)
model = workload.module.TinyGPT(depth=4).train()
ckptplan.autoplan(model, workload.inputs(2), budget="70%", cache_dir=sys.argv[2])
assert model.ckptplan_applied.regions
"""


def test_a_restarted_process_reads_the_plan_back(tmp_path: Path) -> None:
    ckptplan.autoplan(build(), batch(), budget="70%", cache_dir=tmp_path)
    (cached,) = tmp_path.iterdir()
    command = [sys.executable, "-c", RESTART, str(MODELS / "tiny_gpt.py"), str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"plan read from the cache, {cached}" in done.stderr
    assert "solved a plan" not in done.stderr and list(tmp_path.iterdir()) == [cached]


def test_a_changed_model_or_batch_is_solved_again(tmp_path: Path, solves: list[str]) -> None:
    ckptplan.autoplan(build(), batch(), budget="70%", cache_dir=tmp_path)
    shallower = ckptplan.autoplan(build(depth=3), batch(), budget="70%", cache_dir=tmp_path)
    assert all(
        int(path.split(".")[1]) < 3 for r in shallower.ckptplan_applied.regions for path in r
    )
    longer = tuple(torch.cat([t, t], dim=0) for t in batch())
    ckptplan.autoplan(build(), longer, budget="70%", cache_dir=tmp_path)
    assert solves == ["70%"] * 3
    assert len(list(tmp_path.iterdir())) == 3


def test_an_unreadable_cached_plan_is_solved_again(tmp_path: Path, solves: list[str]) -> None:
    ckptplan.autoplan(build(), batch(), budget="70%", cache_dir=tmp_path)
    (cached,) = tmp_path.iterdir()
    cached.write_text("{not json")
    model = ckptplan.autoplan(build(), batch(), budget="70%", cache_dir=tmp_path)
    assert solves == ["70%", "70%"] and model.ckptplan_applied.regions
    assert ckptplan.Plan.load(cached).regions


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"budget": "12XB", "example_inputs": ()}, "budget='12XB': unknown unit 'XB'"),
        ({"budget": "-1GB", "example_inputs": ()}, "budget='-1GB'"),
        ({"budget": [1], "example_inputs": ()}, "budget=\\[1\\]: pass a string"),
        ({"budget": "1GB", "example_inputs": None}, "needs example_inputs"),
        ({"budget": "1GB", "example_inputs": 3}, "example_inputs= is of type int"),
        ({"budget": "1GB", "example_inputs": (), "dtype": torch.float64}, "dtype=torch.float64"),
    ],
)
def test_bad_arguments_are_one_line_errors(
    tmp_path: Path, solves: list[str], arguments: dict, message: str
) -> None:
    with pytest.raises(CkptplanError, match=message) as error:
        ckptplan.autoplan(build(), cache_dir=tmp_path, **arguments)
    assert "\n" not in str(error.value) and not solves


def test_an_unknown_keyword_is_refused_as_python_refuses_one(solves: list[str]) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'solvr'"):
        ckptplan.autoplan(build(), batch(), budget="1GB", solvr="dp")
    refused = pytest.raises(TypeError, match="unexpected keyword argument 'solvr'")
    with refused, pytest.warns(DeprecationWarning, match="use ckptplan.autoplan"):
        ckptplan.apply(build(), budget="1GB", example_inputs=batch(), solvr="dp")
    assert not solves


def test_the_old_spelling_apply_with_a_budget_warns_and_is_autoplan(
    tmp_path: Path, solves: list[str]
) -> None:
    """``apply(model, budget=...)`` is ``autoplan`` for one release, taking all it takes
    (``device=`` too, as ``solve`` does)."""
    with pytest.warns(DeprecationWarning) as caught:
        old = ckptplan.apply(
            build(), budget="70%", example_inputs=batch(), cache_dir=tmp_path, device="cpu"
        )
    assert [str(w.message).partition(" is ")[0] for w in caught] == [
        "ckptplan.apply(model, budget=...)",
        "autoplan(device=...)",
    ]
    new = ckptplan.autoplan(build(), batch(), budget="70%", cache_dir=tmp_path)
    assert solves == ["70%"]  # the same settings, so the same cached plan
    assert old.ckptplan_applied.regions == new.ckptplan_applied.regions
    expected, got = gradients(new), gradients(old)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=0, rtol=0, msg=name)


def test_refusals_come_before_solving(tmp_path: Path, solves: list[str]) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(CkptplanError, match=r"cache_dir=.*cannot be made"):
        ckptplan.autoplan(build(), batch(), budget="1GB", cache_dir=blocked / "plans")
    applied = ckptplan.autoplan(build(), batch(), budget="70%", cache_dir=tmp_path)
    with pytest.raises(CkptplanError, match="already checkpointed by ckptplan"):
        ckptplan.autoplan(applied, batch(), budget="60%", cache_dir=tmp_path)
    assert solves == ["70%"]
