"""The training-library examples (Hugging Face Trainer, accelerate, Lightning): one call to
``ckptplan.apply`` before the library wraps the model, the first step's gradients identical to
the unchecked run's, the planned layers really recomputed, and Hugging Face's checkpointing
switched on after apply refused."""

from __future__ import annotations

import importlib.util
import socket
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

import ckptplan
from ckptplan.applying.guards import BatchWarning
from ckptplan.errors import CkptplanError
from ckptplan.loading import load_model_file
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)

BUDGET = "70%"


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"example_{name}", ROOT / "examples" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as import does: dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One plan cache for the module: the examples share a model and batch, so one solve."""
    return tmp_path_factory.mktemp("plans")


@pytest.fixture
def fresh_accelerate() -> Iterator[Callable[[], None]]:
    """accelerate keeps its state (the Trainer's too) per process, past the end of a process
    group: each run starts anew."""
    state = pytest.importorskip("accelerate.state")

    def reset() -> None:
        state.AcceleratorState._reset_state(reset_partial_state=True)

    yield reset
    reset()


def assert_same_gradients(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys() and expected
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0, msg=name)


def assert_recomputed(model: torch.nn.Module) -> None:
    applied = model.ckptplan_applied
    assert applied.regions and applied.recomputed == len(applied.regions)


def test_hugging_face_trainer_keeps_the_gradients(
    tmp_path: Path, cache_dir: Path, fresh_accelerate: Callable[[], None]
) -> None:
    pytest.importorskip("transformers")
    trainer = example("train_trainer")
    with warnings.catch_warnings():
        warnings.simplefilter("error", BatchWarning)  # the Trainer's batch is the plan's
        model, got = trainer.train(BUDGET, 1, str(tmp_path / "planned"), cache_dir)
    assert_recomputed(model)
    fresh_accelerate()
    _, expected = trainer.train(None, 1, str(tmp_path / "unchecked"))
    assert_same_gradients(got, expected)


@pytest.mark.parametrize("flag", ["activation_checkpointing", "gradient_checkpointing"])
def test_trainer_checkpointing_switched_on_after_apply_is_refused(
    tmp_path: Path, cache_dir: Path, fresh_accelerate: Callable[[], None], flag: str
) -> None:
    transformers = pytest.importorskip("transformers")
    trainer = example("train_trainer")
    workload = load_model_file(trainer.MODEL_FILE)
    batch = workload.inputs(trainer.BATCH_SIZE)
    model = ckptplan.autoplan(workload.build(), batch, budget=BUDGET, cache_dir=cache_dir)
    samples = [{"input_ids": row, "labels": row} for row in batch["input_ids"]]
    arguments = trainer.training_arguments(str(tmp_path), 1, **{flag: True})
    hf_trainer = transformers.Trainer(model=model, args=arguments, train_dataset=samples)
    with pytest.raises(CkptplanError, match="checkpointed twice") as error:
        hf_trainer.train()
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("ranks", ["one process", "DDP"])
def test_accelerate_keeps_the_gradients(
    cache_dir: Path,
    fresh_accelerate: Callable[[], None],
    monkeypatch: pytest.MonkeyPatch,
    ranks: str,
) -> None:
    pytest.importorskip("accelerate")
    if ranks == "DDP":  # what torchrun sets for a world of one: accelerate then prepares DDP
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        world = {"LOCAL_RANK": 0, "RANK": 0, "WORLD_SIZE": 1, "MASTER_PORT": port}
        world |= {"MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": torch.get_num_threads()}
        for name, value in world.items():  # OMP_NUM_THREADS set: accelerate keeps the threads
            monkeypatch.setenv(name, str(value))
    accelerate_example = example("train_accelerate")
    planned = accelerate_example.train(BUDGET, 1, cache_dir)
    wrapped = isinstance(planned.prepared, torch.nn.parallel.DistributedDataParallel)
    assert wrapped == (ranks == "DDP")
    assert_recomputed(planned.model)
    fresh_accelerate()
    unchecked = accelerate_example.train(None, 1)
    assert_same_gradients(planned.gradients, unchecked.gradients)


def test_lightning_keeps_the_gradients(cache_dir: Path) -> None:
    pytest.importorskip("lightning")
    lightning_example = example("train_lightning")
    planned = lightning_example.train(BUDGET, 1, cache_dir)
    planned.configure_model()  # as Lightning calls it again for validate or test: no-op
    assert_recomputed(planned.model)
    unchecked = lightning_example.train(None, 1)
    assert_same_gradients(planned.first_gradients, unchecked.first_gradients)
