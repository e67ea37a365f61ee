"""An applied plan guards its assumptions while training: a batch larger than the plan's warns
(once per shape), and Hugging Face checkpointing switched on after ``apply`` is refused."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

import ckptplan
from ckptplan.applying.guards import BatchWarning, TargetWarning
from ckptplan.errors import CkptplanError
from ckptplan.loading import call_model, load_model_file
from tests.conftest import MODELS

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)


def _planned(name: str, batch: int) -> tuple[object, torch.nn.Module]:
    workload = load_model_file(MODELS / f"{name}.py")
    plan = ckptplan.solve(MODELS / f"{name}.py", budget="1.0", solver="full", batch_size=batch)
    torch.manual_seed(0)
    return workload, ckptplan.apply(workload.build().train(), plan)


def _step(workload, model: torch.nn.Module, batch: int) -> None:
    workload.loss(call_model(model, workload.inputs(batch))).backward()


def test_a_larger_batch_than_planned_warns_once() -> None:
    workload, model = _planned("tiny_gpt", 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BatchWarning)
        _step(workload, model, 2)
        _step(workload, model, 1)
    with pytest.warns(BatchWarning, match="input elements against the"):
        _step(workload, model, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BatchWarning)
        _step(workload, model, 4)


def test_a_batch_warning_reaches_the_user_once(caplog) -> None:
    """A ``BatchWarning`` and nothing on the log besides: the user reads it once, not twice."""
    workload, model = _planned("tiny_gpt", 2)
    with (
        caplog.at_level(logging.WARNING, logger="ckptplan"),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        _step(workload, model, 4)
    assert [w.category for w in caught] == [BatchWarning]
    assert caplog.records == []


def test_hugging_face_checkpointing_switched_on_after_apply_is_refused() -> None:
    pytest.importorskip("transformers")
    workload, model = _planned("hf_gpt2", 2)
    _step(workload, model, 2)
    model.activation_checkpointing_enable()
    with pytest.raises(CkptplanError, match="checkpointed twice"):
        _step(workload, model, 2)


def test_a_plan_for_a_gpu_warns_once_when_it_trains_on_the_cpu() -> None:
    """A plan made with ``--target h100`` trained on the CPU without a word; ``apply`` may
    come before ``.to("cuda")``, so the first forward warns, once."""
    workload = load_model_file(MODELS / "tiny_gpt.py")
    for target, warns in (("h100", True), ("cpu", False)):
        with warnings.catch_warnings():
            warnings.simplefilter("error", TargetWarning)  # solve's fake run: no user's step
            plan = ckptplan.solve(MODELS / "tiny_gpt.py", budget="1.0", target=target, batch_size=2)
        torch.manual_seed(0)
        model = ckptplan.apply(workload.build().train(), plan)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _step(workload, model, 2)
            _step(workload, model, 2)
        targets = [w for w in caught if issubclass(w.category, TargetWarning)]
        assert len(targets) == (1 if warns else 0)
        if warns:
            assert "made for h100" in str(targets[0].message)
