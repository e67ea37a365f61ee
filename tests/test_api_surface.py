"""The Python API shows its options: every option a keyword-only parameter of the functions that
take its concern (no ``**kwargs``), old spellings warned of one way, one resolved budget whose
refusal is worded in one place, and offload only where a copy pays (``--no-offload``: never).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import pydoc
import re
import warnings
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import ckptplan
from ckptplan import devices
from ckptplan.cli.main import cli
from ckptplan.deprecation import fields_of
from ckptplan.errors import BelowLeastPeak
from ckptplan.loading import load_model_file
from ckptplan.options import Parallel, ProfileOptions, SolveOptions
from ckptplan.values.budget import ResolvedBudget
from tests.conftest import MODELS

TINY = MODELS / "tiny_gpt.py"
PUBLIC = ("solve", "apply", "verify", "profile", "autoplan", "fit", "solve_pipeline")
STEP = set(fields_of(ProfileOptions()))
SEARCH = set(fields_of(SolveOptions()))
RANKS = set(fields_of(Parallel()))
TAKES = {
    "solve": STEP | SEARCH | RANKS,
    "autoplan": STEP | SEARCH | RANKS,
    "fit": STEP | SEARCH | RANKS,
    "profile": STEP | RANKS,
    "optimality_gap_of_auto": STEP - RANKS,
    # A pipeline plans the whole step in eager mode, by bisecting dp's or auto's target.
    "solve_pipeline": (STEP | SEARCH | RANKS) - {"scope", "fake_run", "every", "compiled"},
}
"""The options fields each function takes, each as a keyword-only parameter of its name."""


def _function(name: str):
    return getattr(ckptplan, name, None) or getattr(ckptplan.api, name)


@pytest.mark.parametrize("name", PUBLIC)
def test_no_public_function_hides_keywords(name: str) -> None:
    parameters = inspect.signature(getattr(ckptplan, name)).parameters.values()
    assert not [p for p in parameters if p.kind is p.VAR_KEYWORD]


@pytest.mark.parametrize("name", sorted(TAKES))
def test_every_option_of_a_concern_is_a_keyword_only_parameter(name: str) -> None:
    """What keeps a new field from being left out of a signature (Note [one field per option])."""
    signature = inspect.signature(_function(name))
    keyword_only = {n for n, p in signature.parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert TAKES[name] <= keyword_only
    defaults = {**fields_of(ProfileOptions()), **fields_of(SolveOptions()), **fields_of(Parallel())}
    assert {n: signature.parameters[n].default for n in TAKES[name]} == {
        n: defaults[n] for n in TAKES[name]
    }


def test_help_shows_the_options_with_their_defaults() -> None:
    text = pydoc.render_doc(ckptplan.solve, renderer=pydoc.plaintext)
    for shown in ("target: 'Target' = 'cpu'", "solver: 'SolverName' = 'auto'", "offload"):
        assert shown in text


def test_old_spellings_warn_in_one_form_and_mean_the_new() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        old = ckptplan.profile(TINY, device="h100", profile_options=ProfileOptions(batch_size=2))
    new = ckptplan.profile(TINY, target="h100", batch_size=2)
    assert [str(w.message) for w in caught] == [
        "profile(device=...) is deprecated and goes in ckptplan 0.2; use profile(target=...)",
        "profile(profile_options=ProfileOptions(...)) is deprecated and goes in ckptplan 0.2; "
        "use its fields as keywords of profile",
    ]
    assert all(w.filename == __file__ for w in caught)  # pointing at the caller's line
    assert (old.settings, old.peak_bytes) == (new.settings, new.peak_bytes)
    with pytest.raises(TypeError, match="target= twice"), pytest.warns(DeprecationWarning):
        ckptplan.profile(TINY, device="cpu", target="cpu")


def test_the_selective_margin_is_the_selective_slack_now() -> None:
    cpu = devices.get_device("cpu")
    with pytest.warns(DeprecationWarning, match=r"Device\.selective_margin is deprecated"):
        assert cpu.selective_margin == cpu.selective_slack == 0.03


def test_the_plan_records_the_one_resolved_budget() -> None:
    plan = ckptplan.solve(TINY, budget="1.0", solver="dp", batch_size=2, fake_run=False)
    budget = ResolvedBudget(plan.budget.text, plan.budget.bytes, "step", 0.1)
    assert (plan.budget.margin_percent, plan.budget.aim_bytes) == (0.1, budget.aim)
    assert budget.aim == plan.budget.bytes - round(plan.budget.bytes * 0.001)
    # A fixed policy is the plan the user named: it holds nothing back.
    fixed = ckptplan.solve(TINY, budget="1.0", solver="full", batch_size=2, fake_run=False)
    assert (fixed.budget.margin_percent, fixed.budget.aim_bytes) == (0.0, fixed.budget.bytes)


def test_a_refusal_below_the_least_peak_is_worded_in_one_place(tmp_path: Path) -> None:
    """``solve``, ``fit`` and ``autoplan`` refuse in the words ``ResolvedBudget`` builds, with
    the budget that would be taken, the margin counted."""
    with pytest.raises(BelowLeastPeak) as solved:
        ckptplan.solve(TINY, budget="10KB", batch_size=1, scope="activations", fake_run=False)
    least = solved.value.least_bytes
    words = ResolvedBudget("10KB", 10**4, "activations", 0.1).below_least_peak(
        least, "tiny_gpt.py with solver auto (scope activations)"
    )
    assert str(solved.value) == str(words)

    with pytest.raises(BelowLeastPeak) as fitted:
        ckptplan.fit(TINY, budget="10KB", scope="activations", fake_run=False, max_size=2)
    assert str(fitted.value) == f"even batch 1 is refused: {words}"

    workload = load_model_file(TINY)
    with pytest.raises(BelowLeastPeak) as planned:
        ckptplan.autoplan(
            workload.build(),
            workload.inputs(1),
            budget="10KB",
            scope="activations",
            fake_run=False,
            cache_dir=tmp_path,
        )
    assert re.fullmatch(
        r"budget 9\.77 KiB less its 0\.1% margin is below the least feasible peak \S+ \S+ "
        r"of \S+ with solver auto \(scope activations\); use budget='\S+' or more",
        str(planned.value),
    )


def test_a_copy_too_small_to_pay_for_itself_is_never_offered() -> None:
    h100 = devices.get_device("h100")
    # A Llama layer's norm statistics (16 KiB): offered before, at 0.3 µs a round trip.
    assert h100.offload_time(16 * 2**10) is None
    assert h100.least_offload_bytes == pytest.approx(500e3)
    moved = h100.offload_time(2**20)
    assert moved is not None and moved > 2 * h100.efficiency.copy
    assert devices.get_device("cpu").offload_time(2**30) is None  # no host to offload to


def _offloads(plan: dict) -> list[str]:
    return [op for r in plan["regions"] for op in (r.get("policy") or {}).get("offload", ())]


def test_no_offload_plans_offload_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """On a device whose host link is free, a tight budget offloads by default, and not at all
    with ``--no-offload``."""
    free_link = dataclasses.replace(
        devices.DEVICES["l4"],
        host_bandwidth=1e18,
        efficiency=dataclasses.replace(devices.Efficiency(), copy=0.0),
    )
    monkeypatch.setitem(devices.DEVICES, "l4", free_link)
    plans = {}
    for flag in ("--offload", "--no-offload"):
        out = tmp_path / f"{flag}.json"
        common = ["--target", "l4", "--batch-size", "2", "--scope", "activations"]
        arguments = ["solve", str(TINY), "--budget", "30%", *common, flag, "-o", str(out)]
        result = CliRunner().invoke(cli, arguments)
        assert result.exit_code == 0, result.output
        plans[flag] = json.loads(out.read_text())
    assert _offloads(plans["--offload"])
    assert not _offloads(plans["--no-offload"])
    assert plans["--no-offload"]["predicted"].get("offloaded_bytes", 0) == 0


def test_the_runtime_apply_takes_no_planner_keywords(tmp_path: Path) -> None:
    """``apply`` applies: a plan is required, and no solve setting is among its parameters."""
    assert list(inspect.signature(ckptplan.apply).parameters) == ["model", "plan", "force", "stage"]
    with pytest.raises(TypeError, match="'plan'"), warnings.catch_warnings():
        warnings.simplefilter("error")
        ckptplan.apply(torch.nn.Linear(2, 2))
