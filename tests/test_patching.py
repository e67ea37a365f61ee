"""ckptplan's process-wide patches (Note [process-wide patches] in ``ckptplan.patching``): each
holds only while its run does, leaves the caller's very object in place after it, and two
threads that patch at once take turns instead of restoring each other's replacements."""

from __future__ import annotations

import logging
import os
import threading
import time
import types
import warnings
from typing import cast

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ckptplan.callerstate import keeps_random_state
from ckptplan.loading import Workload as LoadedWorkload
from ckptplan.loading import build_fake
from ckptplan.patching import patched, patched_config, patched_env
from ckptplan.profiling.allocmeter import allocator_peak
from ckptplan.profiling.fakepaths import real_step_paths
from ckptplan.profiling.memtrack import LiveStorageTracker, rng_states_counted
from ckptplan.quietlogs import fake_run_logs_quieted, library_noise_quieted

FAKE_TENSOR_LOG = logging.getLogger("torch._subclasses.fake_tensor")


def test_patched_puts_back_the_callers_own_object_and_removes_an_inherited_ones_shadow() -> None:
    class Base:
        def name(self) -> str:
            return "base"

    class Child(Base):
        pass

    owner = types.SimpleNamespace(value=object())
    before = owner.value
    with patched(owner, "value", 2), patched(Child, "name", lambda self: "patched"):
        assert owner.value == 2
        assert Child().name() == "patched"
    assert owner.value is before
    assert "name" not in vars(Child)
    assert Child().name() == "base"


def test_patched_env_keeps_a_level_the_caller_set(monkeypatch) -> None:
    monkeypatch.setenv("CKPTPLAN_TEST_VARIABLE", "caller")
    with patched_env("CKPTPLAN_TEST_VARIABLE", "ckptplan"):
        assert os.environ["CKPTPLAN_TEST_VARIABLE"] == "caller"
    monkeypatch.delenv("CKPTPLAN_TEST_VARIABLE")
    with patched_env("CKPTPLAN_TEST_VARIABLE", "ckptplan"):
        assert os.environ["CKPTPLAN_TEST_VARIABLE"] == "ckptplan"
    assert "CKPTPLAN_TEST_VARIABLE" not in os.environ


def test_module_apply_is_patched_while_a_fake_model_is_built_only() -> None:
    original = vars(torch.nn.Module)["_apply"]
    seen = []

    class Workload:
        def build(self) -> torch.nn.Module:
            seen.append(vars(torch.nn.Module)["_apply"])
            return torch.nn.Linear(2, 2).to(torch.float64)

    with FakeTensorMode():
        model = build_fake(cast(LoadedWorkload, Workload()))
    assert model.weight.dtype == torch.float64
    assert seen and seen[0] is not original
    assert vars(torch.nn.Module)["_apply"] is original


def test_rng_state_counting_leaves_torchs_function_in_place() -> None:
    original = torch.get_rng_state
    tracker = LiveStorageTracker()
    with tracker, rng_states_counted(tracker):
        assert torch.get_rng_state is not original
        torch.get_rng_state()
    assert torch.get_rng_state is original


def test_transformers_packed_sequence_question_is_answered_for_the_run_only() -> None:
    masking = pytest.importorskip("transformers.masking_utils")
    original = masking.find_packed_sequence_indices
    with real_step_paths({"input_ids": torch.zeros(1, 4, dtype=torch.long)}):
        assert masking.find_packed_sequence_indices is not original
    assert masking.find_packed_sequence_indices is original


def test_the_allocator_meter_leaves_no_kineto_level_behind(monkeypatch) -> None:
    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)

    def step() -> None:
        torch.ones(8).sum()

    allocator_peak(step)
    assert "KINETO_LOG_LEVEL" not in os.environ


def test_fsdp_storage_functions_are_the_callers_after_a_rank_is_measured() -> None:
    if not torch.distributed.is_available():
        pytest.skip("no torch.distributed")
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    from ckptplan.planning.distributed import RankMemory

    original = _fsdp_param.alloc_storage
    with RankMemory():
        assert _fsdp_param.alloc_storage is not original
    assert _fsdp_param.alloc_storage is original


def test_quieted_loggers_and_warnings_keep_their_level_flag_and_filters() -> None:
    noisy = logging.getLogger("transformers.modeling_utils")
    own = logging.getLogger("ckptplan")
    before = [(log, log.level, log.disabled, log.filters) for log in (FAKE_TENSOR_LOG, noisy, own)]
    warning_filters = warnings.filters
    with fake_run_logs_quieted((DeprecationWarning,)):
        assert warnings.filters is not warning_filters
        assert not FAKE_TENSOR_LOG.isEnabledFor(logging.CRITICAL)
        assert not own.isEnabledFor(logging.CRITICAL)
        assert len(noisy.filters) == len(before[1][3]) + 1
    for log, level, disabled, filters in before:
        assert (log.level, log.disabled) == (level, disabled)
        assert log.filters is filters
    assert warnings.filters is warning_filters


def test_functorch_config_is_set_for_the_run_only() -> None:
    from torch._functorch import config as functorch_config

    before = functorch_config.activation_memory_budget
    with patched_config(functorch_config, activation_memory_budget=0.25):
        assert functorch_config.activation_memory_budget == 0.25
    assert functorch_config.activation_memory_budget == before


def test_a_second_thread_waits_for_the_first_threads_patch_to_end() -> None:
    owner = types.SimpleNamespace(value="caller")
    inside, release, seen = threading.Event(), threading.Event(), []

    def first() -> None:
        with patched(owner, "value", "first"):
            inside.set()
            release.wait(10)

    def second() -> None:
        with patched(owner, "value", "second"):
            seen.append(owner.value)

    one = threading.Thread(target=first)
    one.start()
    assert inside.wait(10)
    two = threading.Thread(target=second)
    two.start()
    two.join(0.2)
    assert two.is_alive(), "the second thread patched while the first's patch held"
    release.set()
    one.join(10)
    two.join(10)
    assert seen == ["second"]
    assert owner.value == "caller"


def test_threads_quieting_logs_and_counting_rng_at_once_leave_everything_as_it_was() -> None:
    original_rng = torch.get_rng_state
    before = (FAKE_TENSOR_LOG.disabled, FAKE_TENSOR_LOG.filters)
    errors: list[BaseException] = []

    def plan_like() -> None:
        try:
            for _ in range(50):
                tracker = LiveStorageTracker()
                with (
                    fake_run_logs_quieted(),
                    library_noise_quieted(),
                    tracker,
                    rng_states_counted(tracker),
                ):
                    assert FAKE_TENSOR_LOG.disabled
                    assert torch.get_rng_state is not original_rng
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=plan_like) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert torch.get_rng_state is original_rng
    assert (FAKE_TENSOR_LOG.disabled, FAKE_TENSOR_LOG.filters) == before
    assert FAKE_TENSOR_LOG.filters is before[1]


def test_threads_seeding_at_once_each_draw_their_own_stream_and_leave_the_callers() -> None:
    """Public entry points seed the global generators under a fork: two threads at once must
    not draw from each other's seed, nor put back the other's seeded state as the caller's."""

    @keeps_random_state
    def seeded_draw(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        time.sleep(0.05)  # the other thread's seed would land here without the lock
        return torch.rand(3)

    expected = {}
    for seed in (1, 2):
        torch.manual_seed(seed)
        expected[seed] = torch.rand(3)
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    drawn: dict[int, torch.Tensor] = {}
    threads = [
        threading.Thread(target=lambda s=seed: drawn.__setitem__(s, seeded_draw(s)))
        for seed in (1, 2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(torch.equal(drawn[seed], expected[seed]) for seed in (1, 2))
    assert torch.equal(torch.get_rng_state(), before)
