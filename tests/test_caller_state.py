"""The library leaves its caller's process as it was: torch's random stream, glibc's malloc, the
dispatch mode stack."""

from __future__ import annotations

import ctypes.util

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import ckptplan
from tests.conftest import MODELS, ROOT

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)

MODEL = MODELS / "tiny_gpt.py"


@pytest.fixture
def malloc_calls(monkeypatch) -> list[str]:
    """The C libraries looked up while the test runs (malloc tuning looks up libc)."""
    calls: list[str] = []
    found = ctypes.util.find_library

    def recording(name: str) -> str | None:
        calls.append(name)
        return found(name)

    monkeypatch.setattr(ctypes.util, "find_library", recording)
    return calls


def test_solve_profile_and_verify_keep_the_callers_random_stream(malloc_calls) -> None:
    torch.manual_seed(1234)
    expected = torch.rand(4)
    torch.manual_seed(1234)
    ckptplan.profile(MODEL, measure=True)
    plan = ckptplan.solve(MODEL, budget="70%", solver="dp")
    ckptplan.verify(MODEL, plan, run_on="cpu", repeats=1)
    assert torch.equal(torch.rand(4), expected), "the caller's random stream moved"
    assert "c" not in malloc_calls, "the library tuned glibc's malloc for the whole process"


def test_a_step_that_fails_on_fake_tensors_leaves_no_dispatch_mode_behind() -> None:
    """Mixtral's token routing raises inside a block's forward on fake tensors (the profile then
    takes a real step); the mode entered when that block began must not outlive the profile."""
    pytest.importorskip("transformers")
    profile = ckptplan.profile(ROOT / "sample_models" / "zoo" / "hf_mixtral.py")
    assert any("real step" in note for note in profile.notes)
    assert _get_current_dispatch_mode_stack() == []
