"""The Python API takes torch's own types: ``torch.dtype`` and optimizer classes, whose state is
measured by their own first step (Adafactor's factored moments are far smaller than AdamW's)."""

from __future__ import annotations

import doctest

import pytest
import torch

import ckptplan
import ckptplan.profiling.training
from ckptplan.errors import CkptplanError
from tests.conftest import MODELS

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)

TINY = MODELS / "tiny_gpt.py"


def test_docstring_examples() -> None:
    assert doctest.testmod(ckptplan.profiling.training).failed == 0


def test_a_torch_dtype_is_its_name() -> None:
    by_type = ckptplan.profile(TINY, batch_size=2, dtype=torch.bfloat16)
    by_name = ckptplan.profile(TINY, batch_size=2, dtype="bf16")
    assert by_type.settings.dtype == "bf16"
    assert by_type.peak_bytes == by_name.peak_bytes


def test_an_optimizer_class_is_measured_by_its_own_step() -> None:
    adamw = ckptplan.profile(TINY, batch_size=2, optimizer=torch.optim.AdamW)
    factored = ckptplan.profile(TINY, batch_size=2, optimizer=torch.optim.Adafactor)
    momentum = ckptplan.profile(TINY, batch_size=2, optimizer="torch.optim.SGD")
    assert adamw.settings.optimizer == "torch.optim.adamw.AdamW"
    # AdamW: two moments per parameter (and a step count per tensor).
    assert adamw.optimizer_bytes >= 2 * adamw.parameter_bytes
    assert 0 < factored.optimizer_bytes < adamw.optimizer_bytes / 4
    # torch's SGD without momentum keeps no state.
    assert momentum.optimizer_bytes == 0


def test_a_plan_made_with_an_optimizer_class_records_it() -> None:
    plan = ckptplan.solve(
        TINY, budget="1.0", solver="none", batch_size=2, optimizer=torch.optim.Adafactor
    )
    assert plan.settings.optimizer == "torch.optim.Adafactor"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"optimizer": torch.nn.Linear}, "torch.optim.Optimizer class"),
        ({"optimizer": "torch.optim.NoSuch"}, "no such class"),
        ({"dtype": torch.int8}, "plans for fp32"),
    ],
)
def test_other_types_are_one_line_errors(kwargs, message) -> None:
    with pytest.raises(CkptplanError, match=message):
        ckptplan.profile(TINY, batch_size=2, **kwargs)
