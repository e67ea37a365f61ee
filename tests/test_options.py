"""One object per concern (Note [one field per option] in ``ckptplan.options``): the API's
keywords and the CLI's flags land in the fields of the same name, so the old spelling of a call
(an options object) makes the same plan as the keywords, and a flag or keyword no options
object has is refused."""

from __future__ import annotations

import dataclasses
from typing import Any, get_args

import pytest

import ckptplan
from ckptplan.cli.main import solve as solve_command
from ckptplan.devices import DEVICES
from ckptplan.options import Parallel, ProfileOptions, SolveOptions, Target
from ckptplan.solvers import SolverOptions
from tests.conftest import MODELS

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)

TINY = MODELS / "tiny_gpt.py"


def test_the_target_names_are_the_devices() -> None:
    assert sorted(get_args(Target)) == sorted(DEVICES)


def test_the_old_options_objects_still_make_the_same_plan_and_say_so() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        by_object = ckptplan.solve(
            TINY,
            budget="1.0",
            solve_options=SolveOptions(solver="every-k", solver_options=SolverOptions(every=3)),
            profile_options=ProfileOptions(batch_size=2, optimizer="sgd"),
        )
    assert [str(w.message).partition(" is ")[0] for w in caught] == [
        "solve(profile_options=ProfileOptions(...))",
        "solve(solve_options=SolveOptions(...))",
    ]
    by_keyword = ckptplan.solve(
        TINY, budget="1.0", solver="every-k", every=3, batch_size=2, optimizer="sgd"
    )
    assert by_object.to_json() == by_keyword.to_json()
    assert by_object.settings.optimizer == "sgd" and by_object.settings.batch_size == 2
    # The nested solver option is honoured, not dropped: every second block differs.
    every_second = ckptplan.solve(TINY, budget="1.0", solver="every-k", batch_size=2)
    assert by_object.regions != every_second.regions


def test_a_keyword_no_options_object_has_is_refused() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_segments'"):
        ckptplan.solve(TINY, budget="0.8", max_segments=2)


def test_the_old_parallel_keyword_still_works_and_says_so() -> None:
    with pytest.warns(DeprecationWarning, match="strategy='fsdp'"):
        old = ckptplan.profile(TINY, batch_size=2, world_size=2, parallel="fsdp")
    with pytest.warns(DeprecationWarning, match=r"parallel=Parallel\(...\)"):
        by_object = ckptplan.profile(
            TINY, parallel=Parallel(world_size=2, strategy="fsdp"), batch_size=2
        )
    new = ckptplan.profile(TINY, world_size=2, strategy="fsdp", batch_size=2)
    assert old.parameter_bytes == by_object.parameter_bytes == new.parameter_bytes
    assert new.parameter_bytes < ckptplan.profile(TINY).parameter_bytes


def _fields(config: Any) -> set[str]:
    names = set()
    for entry in dataclasses.fields(config):
        value = getattr(config, entry.name)
        names |= _fields(value) if dataclasses.is_dataclass(value) else {entry.name}
    return names


def test_every_flag_of_solve_is_an_options_field_or_the_commands_own() -> None:
    """What makes a new option one field, its reader and one flag: ``solve`` hands no flag to
    the API by hand."""
    own = {"model", "budget", "output", "as_json", "old_target", "task", "seq_len", "image_size"}
    own |= {"pipeline_stages", "microbatches", "schedule", "stages_per_rank", "stage_split"}
    fields = _fields(SolveOptions()) | _fields(ProfileOptions()) | _fields(Parallel())
    flags = {param.name for param in solve_command.params}
    assert flags - own <= fields
    assert fields - {"fake_run"} <= flags - own
