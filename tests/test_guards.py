"""An applied plan guards its assumptions while training: a batch larger than the plan's warns
(once per shape), and Hugging Face checkpointing switched on after ``apply`` is refused."""

from __future__ import annotations

import warnings

import pytest
import torch

import ckptplan
from ckptplan.applying.guards import BatchWarning
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


def test_hugging_face_checkpointing_switched_on_after_apply_is_refused() -> None:
    pytest.importorskip("transformers")
    workload, model = _planned("hf_gpt2", 2)
    _step(workload, model, 2)
    model.activation_checkpointing_enable()
    with pytest.raises(CkptplanError, match="checkpointed twice"):
        _step(workload, model, 2)
