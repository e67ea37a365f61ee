"""The typed values behind the profile's phase labels, the step's peak events and a plan's
prediction: labels and JSON spelled exactly as before, parsed back to the same value."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ckptplan.values.peak_event import OUTSIDE_PHASES, EventKind, PeakEvent
from ckptplan.values.phase import Direction, Phase, Where
from ckptplan.values.plan import Plan, PlanSettings
from ckptplan.values.prediction import Prediction, StagePrediction
from tests.test_torch_free import imports_without_torch

pytestmark = pytest.mark.torchfree

LABELS = (
    "fwd:0",
    "bwd:12",
    "fwd:gap2",
    "bwd:gap0",
    "fwd:pre",
    "fwd:post",
    "bwd:pre",
    "bwd:post",
    "bwd:?",
    "opt",
    "start",
    "end",
)


@pytest.mark.parametrize("label", LABELS)
def test_a_phase_label_parses_to_the_phase_that_spells_it(label: str) -> None:
    assert Phase.parse(label).label == label


def test_phases_say_where_they_run() -> None:
    assert Phase.parse("bwd:3") == Phase.backward(3)
    assert Phase.backward(3).block_index == 3 and Phase.backward(3).is_backward
    assert Phase.gap(Direction.FORWARD, 2).block_index is None
    assert Phase.gap(Direction.FORWARD, 2).moved(5).label == "fwd:gap5"
    assert Phase.pre(Direction.FORWARD).moved(5) == Phase.pre(Direction.FORWARD)
    assert Phase.optimizer().direction is None and Phase.optimizer().where is Where.OPTIMIZER


@pytest.mark.parametrize("label", ["fwd:x", "bwd:gap", "fwd:-1", "fwd", "opt:0", ""])
def test_anything_else_is_no_phase(label: str) -> None:
    with pytest.raises(ValueError):
        Phase.parse(label)


def test_a_phase_needs_what_its_place_needs() -> None:
    with pytest.raises(ValueError):
        Phase(Where.BLOCK, Direction.FORWARD)
    with pytest.raises(ValueError):
        Phase(Where.OPTIMIZER, Direction.FORWARD)


EVENTS = (
    "forward of layers.0",
    "recompute of encoder",
    "backward of blocks.11.attn",
    "forward between encoder.1 and encoder.2",
    "backward between down.0 and up.3",
    "forward before the blocks",
    "forward after the blocks (head, loss)",
    "backward after the blocks (head, loss)",
    "backward before the blocks",
    "optimizer step",
    "start",
)


@pytest.mark.parametrize("text", EVENTS)
def test_an_event_text_parses_to_the_event_that_shows_it(text: str) -> None:
    assert PeakEvent.parse(text).label == text


def test_events_are_matched_by_kind_and_module() -> None:
    event = PeakEvent.parse("backward between down.0 and up.3")
    assert event == PeakEvent.between(Direction.BACKWARD, "down.0", "up.3")
    assert (event.kind, event.module, event.next_module) == (
        EventKind.BACKWARD_BETWEEN,
        "down.0",
        "up.3",
    )
    assert PeakEvent.parse("recompute of a") == PeakEvent.recompute("a")
    assert [PeakEvent.outside(p).phase for p in OUTSIDE_PHASES] == list(OUTSIDE_PHASES)
    assert PeakEvent.backward("a").phase is None
    with pytest.raises(ValueError):
        PeakEvent.parse("loss")


FULL = {
    "peak_bytes": 1000,
    "peak_event": "backward of layers.1",
    "parameters": 100,
    "gradients": 100,
    "optimizer": 200,
    "inputs": 10,
    "activations": 590,
    "recompute_time_s": 0.25,
    "step_time_s": 3.0,
    "offloaded_bytes": 0,
    "overhead": 0.25 / 3.0,
    "compiled_partition": {"saved": ["a"], "saved_bytes": 4, "graphs": 1},
    "fake_run_peak_bytes": 990,
    "in_flight": 2,
    "from_a_later_version": [1, 2],
}


def test_a_prediction_is_written_as_it_was_read() -> None:
    prediction = Prediction.from_json(FULL)
    assert json.dumps(prediction.to_json()) == json.dumps(FULL)
    assert prediction.extra == {"from_a_later_version": [1, 2]}
    assert prediction.overhead == FULL["overhead"]
    confirmed = replace(prediction, fake_run_peak_bytes=1)
    assert prediction.fake_run_peak_bytes == 990 and confirmed.fake_run_peak_bytes == 1


def test_a_prediction_before_its_fake_run_writes_no_fake_run_figures() -> None:
    data = {k: v for k, v in FULL.items() if k not in ("compiled_partition", "fake_run_peak_bytes")}
    data.pop("in_flight")
    data.pop("from_a_later_version")
    assert list(Prediction.from_json(data).to_json()) == list(data)


def test_a_stage_prediction_is_written_as_it_was_read() -> None:
    data = {
        "fixed_bytes": 1,
        "buffer_bytes": 2,
        "kept_bytes_per_microbatch": 3,
        "microbatch_peak_bytes": 4,
        "recompute_time_s": 0.5,
        "note": "kept",
    }
    assert json.dumps(StagePrediction.from_json(data).to_json()) == json.dumps(data)


def test_a_plan_file_round_trips_unchanged(tmp_path) -> None:
    stage = {
        "index": 0,
        "rank": 0,
        "blocks": ["layers.0"],
        "regions": [{"modules": ["layers.0"]}],
        "budget_bytes": 2000,
        "predicted_peak_bytes": 1000,
        "in_flight": 2,
        "parameters": {"parameters": 10, "digest": "x"},
        "predicted": {
            "fixed_bytes": 1,
            "buffer_bytes": 2,
            "kept_bytes_per_microbatch": 3,
            "microbatch_peak_bytes": 4,
            "recompute_time_s": 0.5,
        },
    }
    data = {
        "schema": "ckptplan.plan/1",
        "model": "m",
        "fingerprint": {"class": "M", "parameters": 10},
        "inputs": None,
        "budget": {"text": "2000", "bytes": 2000, "scope": "step"},
        "solver": "dp",
        "settings": {
            "batch_size": 4,
            "optimizer": "adamw",
            "dtype": "fp32",
            "device": "cpu",
            "blocks": None,
            "autocast": None,
            "measure": False,
            "compiled": False,
            "scope": "step",
            "notes": ["use_cache turned off"],
            "world_size": 1,
            "parallel": None,
            "pipeline": {"stages": 1, "microbatches": 2},
            "a_key_from_a_later_version": 1,
        },
        "blocks": ["layers.0"],
        "regions": [{"modules": ["layers.0"]}],
        "predicted": FULL,
        "baselines": {"none": {k: v for k, v in FULL.items() if k != "in_flight"}},
        "stages": [stage],
    }
    text = json.dumps(data, indent=2) + "\n"
    file = tmp_path / "plan.json"
    file.write_text(text)
    Plan.load(file).save(file)
    assert file.read_text() == text


def test_an_older_plans_settings_read_as_the_defaults() -> None:
    settings = PlanSettings.from_json({"batch_size": 2})
    assert (settings.batch_size, settings.optimizer, settings.world_size) == (2, "adamw", 1)
    assert settings.notes == () and settings.pipeline is None


def test_a_hand_written_plan_predicting_only_its_peak_loads() -> None:
    prediction = Prediction.from_json({"peak_bytes": 5})
    assert prediction.peak_bytes == 5 and prediction.overhead == 0.0


@pytest.mark.parametrize(
    "module", ["ckptplan.values.phase", "ckptplan.values.peak_event", "ckptplan.values.prediction"]
)
def test_the_typed_values_import_without_torch(module: str) -> None:
    assert imports_without_torch(module).returncode == 0
