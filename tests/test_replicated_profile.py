"""Repeated blocks priced once (``ckptplan.profiling.replicate``): the replicated profile is the
traced one.

The replicated profile of a 12-layer Hugging Face Llama must equal the profile traced block by
block in every field (every op record included), and so must the chains, the selective menus
and the plans solved from them. Blocks that are not identical (another width, other ops) are
traced whole, and so is a model whose code outside the blocks depends on how many there are.
"""

from dataclasses import replace

import pytest

from ckptplan.loading import load_model_file
from ckptplan.planning.problem import selective_menus, to_chain
from ckptplan.planning.schedule_plan import plan_from_schedule
from ckptplan.profiling.profiler import Profile, Settings, profile_model
from ckptplan.values.budget import ResolvedBudget
from solvers import run_solver
from tests.conftest import MODELS

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)

LLAMA = MODELS / "hf_llama12.py"
REPLICATED = "repeated blocks priced once"


def _both(path, settings: Settings) -> tuple[Profile, Profile]:
    workload = load_model_file(path)
    return profile_model(workload, settings, min_run=None), profile_model(
        workload, settings, min_run=6
    )


def _replicated(profile: Profile) -> bool:
    return any(note.startswith(REPLICATED) for note in profile.notes)


@pytest.mark.parametrize(
    "settings", [Settings(), Settings(dtype="bf16", device="h100")], ids=["cpu-fp32", "h100-bf16"]
)
def test_replicated_profile_equals_the_traced_one(settings: Settings) -> None:
    traced, replicated = _both(LLAMA, settings)
    assert _replicated(replicated) and not _replicated(traced)
    assert replace(replicated, notes=traced.notes) == traced
    assert len(replicated.blocks) == 12 and replicated.ops == traced.ops


def test_plans_from_the_replicated_profile_equal_the_traced_ones() -> None:
    traced, replicated = _both(LLAMA, Settings())
    chain = to_chain(traced)
    assert to_chain(replicated) == chain
    assert selective_menus(replicated) == selective_menus(traced)
    none, full = run_solver("none", chain, None), run_solver("full", chain, None)
    for fraction in (0.2, 0.5, 0.8):
        budget = int(full.peak + fraction * (none.peak - full.peak))
        plans = [
            plan_from_schedule(
                p, to_chain(p), run_solver("dp", to_chain(p), budget), ResolvedBudget("b", budget)
            )
            for p in (traced, replace(replicated, notes=traced.notes))  # plans record notes
        ]
        assert plans[0] == plans[1]
        assert plans[0].regions


WIDTHS = """
import torch
class Block(torch.nn.Module):
    def __init__(self, hidden, act):
        super().__init__()
        self.up, self.down, self.act = torch.nn.Linear(32, hidden), torch.nn.Linear(hidden, 32), act
    def forward(self, x):
        return x + self.down(self.act(self.up(x)))
def build_model():
    return torch.nn.Sequential(*[Block({hidden}, {act}) for i in range(12)])
def example_inputs(batch_size=8):
    return (torch.randn(batch_size, 32, requires_grad=True),)
def loss_fn(output):
    return output.square().mean()
"""


@pytest.mark.parametrize(
    ("hidden", "act"),
    [
        ("64 if i % 2 else 48", "torch.nn.GELU()"),  # every other block is narrower
        ("64", "torch.nn.GELU() if i % 2 else torch.nn.SiLU()"),  # same weights, other ops
    ],
    ids=["widths", "ops"],
)
def test_blocks_that_differ_are_traced_whole(write_model, hidden: str, act: str) -> None:
    path = write_model(WIDTHS.format(hidden=hidden, act=act))
    traced, replicated = _both(path, Settings())
    assert not _replicated(replicated)
    assert replicated == traced


def test_identical_blocks_of_a_sequential_are_replicated(write_model) -> None:
    traced, replicated = _both(
        write_model(WIDTHS.format(hidden="64", act="torch.nn.GELU()")), Settings()
    )
    assert _replicated(replicated)
    assert replace(replicated, notes=traced.notes) == traced


COUNTED = """
import torch
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(12))
    def forward(self, x):
        outputs = []
        for layer in self.layers:
            x = layer(x)
            outputs.append(x)
        return torch.stack(outputs).sum()  # the code after the blocks grows with their number
def build_model():
    return Model()
def example_inputs(batch_size=8):
    return (torch.randn(batch_size, 32),)
def loss_fn(output):
    return output
"""


def test_code_that_counts_the_blocks_is_traced_whole(write_model) -> None:
    traced, replicated = _both(write_model(COUNTED), Settings())
    assert not _replicated(replicated)
    assert any("traced one by one" in note for note in replicated.notes)
    assert replace(replicated, notes=traced.notes) == traced
