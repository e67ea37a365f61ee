"""Selective options as ``torch.compile``'s partitioner carries them out
(``ckptplan.planning.compiled_menus``): which values backward reads back, what an option
keeps, and the partition the partitioner then makes from the option's tags."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

import ckptplan
from ckptplan.planning.problem import block_forward_ops, op_names, selective_menus
from ckptplan.stepping.compiled import CompiledModel, Partition, partitioning_backend
from ckptplan.values.plan import Region
from ckptplan.values.policy_types import OpCall, Policy
from ckptplan.values.profile_types import Profile

WIDTH = 32
BATCH = 256


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def loss_fn(out: torch.Tensor) -> torch.Tensor:
    return out.pow(2).mean()


UP, GELU, DOWN = "aten.addmm.default#0", "aten.gelu.default#0", "aten.addmm.default#1"
ADD = "aten.add.Tensor#0"
HIDDEN = BATCH * 4 * WIDTH * 4
"""Bytes of one block's hidden activation (the up projection's output, and GELU's)."""


@pytest.fixture(scope="module")
def compiled_profile() -> Profile:
    torch.manual_seed(0)
    return ckptplan.profile(Net(), (torch.randn(BATCH, WIDTH),), loss_fn=loss_fn, compiled=True)


def test_the_profile_marks_the_values_backward_reads(compiled_profile) -> None:
    ops = block_forward_ops(compiled_profile)[1]
    read = {n for n, op in zip(op_names(ops), ops, strict=True) if op.saved_for_backward}
    # GELU's input (the up projection's output) and the down projection's input (GELU's
    # output); never the down projection's own output, which only the residual add reads.
    assert {UP, GELU} <= read
    assert DOWN not in read


def test_a_compiled_option_keeps_only_what_backward_reads(compiled_profile) -> None:
    menu = {s.saved: s for s in selective_menus(compiled_profile)[1]}
    # Tagging the up projection keeps its output and rebuilds GELU's from it in backward; the
    # eager menu would also count the down projection's output had it been tagged.
    assert (UP,) in menu
    assert menu[(UP,)].kept_bytes == HIDDEN
    # The down projection's output is kept only where the block's output is rebuilt from it
    # (inside a segment, for the next block's recomputation), never beside a kept output.
    assert all(ADD not in saved for saved in menu if DOWN in saved)
    assert any(saved == (UP, GELU) and s.kept_bytes == 2 * HIDDEN for saved, s in menu.items())


def test_the_partitioner_keeps_what_the_option_priced(compiled_profile) -> None:
    """The option tagging the up projection, applied and compiled, hands backward one hidden
    activation in that block where the unchecked block hands it two."""
    torch.manual_seed(0)
    model, batch = Net().train(), torch.randn(BATCH, WIDTH)
    plan = ckptplan.solve(model, (batch,), loss_fn=loss_fn, budget="100GB", compiled=True)
    region = Region(("blocks.1",), policy=Policy((OpCall.parse(UP),)))

    def hidden_saved(regions: tuple[Region, ...]) -> int:
        log = Partition()
        planned = ckptplan.apply(Net().train(), replace(plan, regions=regions))
        loss_fn(CompiledModel(planned, partitioning_backend(log))(batch)).backward()
        torch._dynamo.reset()
        return sum(1 for graph in log.saved for shape, _ in graph if shape == (BATCH, 4 * WIDTH))

    assert hidden_saved(()) == 2 * 3
    assert hidden_saved((region,)) == 2 * 3 - 1
