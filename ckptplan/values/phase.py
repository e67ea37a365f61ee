"""The phases of one profiled training step, as one typed value.

The live-storage timeline, the op records and the profile's figures are cut into phases: each
block's forward and backward, the code between two blocks (a gap), the code before and after the
blocks, and the optimizer step. Recorded data keeps a phase's ``label`` (``"fwd:3"``,
``"bwd:gap2"``, ``"fwd:pre"``, ``"opt"``), so profiles and their JSON read as before; code builds
and reads labels only through ``Phase``, so no module spells one by hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import Enum


class Direction(Enum):
    """Which pass of the step a phase belongs to."""

    FORWARD = "fwd"
    BACKWARD = "bwd"


class Where(Enum):
    """Where in the step a phase runs."""

    BLOCK = "block"
    """A block's own forward or backward (``index`` is the block)."""
    GAP = "gap"
    """The code between block ``index`` and the next."""
    PRE = "pre"
    """The code before the first block (embeddings), or its backward."""
    POST = "post"
    """The code after the last block (head, loss), or its backward."""
    UNATTRIBUTED = "?"
    """An op of the backward pass that ran inside a forward phase: no block's own."""
    OPTIMIZER = "opt"
    START = "start"
    """Before the first phase is marked."""
    END = "end"
    """After the optimizer step."""


_OUTSIDE_PASSES = (Where.OPTIMIZER, Where.START, Where.END)
_INDEXED = (Where.BLOCK, Where.GAP)
_LABEL = re.compile(r"(fwd|bwd):(?:(\d+)|gap(\d+)|(pre|post|\?))$")


@dataclass(frozen=True)
class Phase:
    """A phase of the step: its pass (None for the optimizer step and the step's ends), where
    it runs, and the block it belongs to or follows (blocks and gaps only)."""

    where: Where
    direction: Direction | None = None
    index: int | None = None

    def __post_init__(self) -> None:
        if (self.direction is None) != (self.where in _OUTSIDE_PASSES):
            raise ValueError(f"a phase at {self.where.value} has no direction {self.direction}")
        if (self.index is None) == (self.where in _INDEXED):
            raise ValueError(f"a phase at {self.where.value} cannot have index {self.index}")

    @classmethod
    def block(cls, direction: Direction, index: int) -> Phase:
        return cls(Where.BLOCK, direction, index)

    @classmethod
    def forward(cls, index: int) -> Phase:
        """Block ``index``'s forward."""
        return cls(Where.BLOCK, Direction.FORWARD, index)

    @classmethod
    def backward(cls, index: int) -> Phase:
        """Block ``index``'s backward."""
        return cls(Where.BLOCK, Direction.BACKWARD, index)

    @classmethod
    def gap(cls, direction: Direction, index: int) -> Phase:
        """The code between block ``index`` and the next, in ``direction``."""
        return cls(Where.GAP, direction, index)

    @classmethod
    def pre(cls, direction: Direction) -> Phase:
        return cls(Where.PRE, direction)

    @classmethod
    def post(cls, direction: Direction) -> Phase:
        return cls(Where.POST, direction)

    @classmethod
    def unattributed(cls, direction: Direction) -> Phase:
        return cls(Where.UNATTRIBUTED, direction)

    @classmethod
    def optimizer(cls) -> Phase:
        return cls(Where.OPTIMIZER)

    @classmethod
    def start(cls) -> Phase:
        return cls(Where.START)

    @classmethod
    def end(cls) -> Phase:
        return cls(Where.END)

    @classmethod
    def parse(cls, label: str) -> Phase:
        """The phase a ``label`` names; ValueError for anything else."""
        for where in _OUTSIDE_PASSES:
            if label == where.value:
                return cls(where)
        match = _LABEL.match(label)
        if match is None:
            raise ValueError(f"{label!r} is not a phase of the step")
        direction = Direction(match[1])
        if match[2] is not None:
            return cls.block(direction, int(match[2]))
        if match[3] is not None:
            return cls.gap(direction, int(match[3]))
        return cls(Where(match[4]), direction)

    @property
    def label(self) -> str:
        """The phase as recorded data spells it."""
        if self.direction is None:
            return self.where.value
        if self.where is Where.BLOCK:
            return f"{self.direction.value}:{self.index}"
        if self.where is Where.GAP:
            return f"{self.direction.value}:gap{self.index}"
        return f"{self.direction.value}:{self.where.value}"

    @property
    def is_forward(self) -> bool:
        return self.direction is Direction.FORWARD

    @property
    def is_backward(self) -> bool:
        return self.direction is Direction.BACKWARD

    @property
    def block_index(self) -> int | None:
        """The block whose own forward or backward this is, else None."""
        return self.index if self.where is Where.BLOCK else None

    def moved(self, index: int) -> Phase:
        """The same phase of another block (or the gap after it); others are unchanged."""
        return replace(self, index=index) if self.where in _INDEXED else self

    def __str__(self) -> str:
        return self.label
