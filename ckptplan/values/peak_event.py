"""The events at which a training step may peak, as one typed value.

A schedule names the event of its peak and a profile the events outside its blocks by their
display text (``"backward of layers.3"``, ``"optimizer step"``): plain strings that plans,
reports and the solvers carry. Code that needs to know which event it is reads
``PeakEvent.parse``'s kind and module, never the wording, so rewording a label changes no figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ckptplan.values.phase import Direction, Phase


class EventKind(Enum):
    """What runs at the event; the value is its display text (or the text before its module)."""

    FORWARD = "forward of"
    """A block's (or an enclosing module's) forward."""
    RECOMPUTE = "recompute of"
    BACKWARD = "backward of"
    FORWARD_BETWEEN = "forward between"
    """The forward of the code between two blocks."""
    BACKWARD_BETWEEN = "backward between"
    FORWARD_BEFORE = "forward before the blocks"
    FORWARD_AFTER = "forward after the blocks (head, loss)"
    BACKWARD_AFTER = "backward after the blocks (head, loss)"
    BACKWARD_BEFORE = "backward before the blocks"
    OPTIMIZER = "optimizer step"
    START = "start"
    """Before anything runs: a chain with no events outside its blocks."""


_OF_MODULE = (EventKind.FORWARD, EventKind.RECOMPUTE, EventKind.BACKWARD)
_BETWEEN = (EventKind.FORWARD_BETWEEN, EventKind.BACKWARD_BETWEEN)
_OUTSIDE = {
    Phase.pre(Direction.FORWARD): EventKind.FORWARD_BEFORE,
    Phase.post(Direction.FORWARD): EventKind.FORWARD_AFTER,
    Phase.post(Direction.BACKWARD): EventKind.BACKWARD_AFTER,
    Phase.pre(Direction.BACKWARD): EventKind.BACKWARD_BEFORE,
    Phase.optimizer(): EventKind.OPTIMIZER,
}
"""The events outside the blocks, by the phase of the step they peak in."""
_PHASES = {kind: phase for phase, kind in _OUTSIDE.items()}


@dataclass(frozen=True)
class PeakEvent:
    """An event of the step: its kind, the module it is about (a block or an enclosing
    module) and, for the code between two blocks, the block after it."""

    kind: EventKind
    module: str | None = None
    next_module: str | None = None

    def __post_init__(self) -> None:
        about = self.kind in _OF_MODULE or self.kind in _BETWEEN
        if about != (self.module is not None) or (self.kind in _BETWEEN) != (
            self.next_module is not None
        ):
            raise ValueError(f"a {self.kind.value!r} event cannot be about {self.module}")

    @classmethod
    def forward(cls, module: str) -> PeakEvent:
        return cls(EventKind.FORWARD, module)

    @classmethod
    def recompute(cls, module: str) -> PeakEvent:
        return cls(EventKind.RECOMPUTE, module)

    @classmethod
    def backward(cls, module: str) -> PeakEvent:
        return cls(EventKind.BACKWARD, module)

    @classmethod
    def between(cls, direction: Direction, block: str, following: str) -> PeakEvent:
        """The code between ``block`` and the ``following`` one, in ``direction``."""
        kind = (
            EventKind.FORWARD_BETWEEN
            if direction is Direction.FORWARD
            else EventKind.BACKWARD_BETWEEN
        )
        return cls(kind, block, following)

    @classmethod
    def outside(cls, phase: Phase) -> PeakEvent:
        """The event of a phase outside the blocks (before, after, the optimizer step)."""
        return cls(_OUTSIDE[phase])

    @classmethod
    def parse(cls, text: str) -> PeakEvent:
        """The event a display ``text`` names; ValueError for anything else."""
        for kind in EventKind:
            if kind in _OF_MODULE and text.startswith(kind.value + " "):
                return cls(kind, text[len(kind.value) + 1 :])
            if kind in _BETWEEN and text.startswith(kind.value + " "):
                block, sep, following = text[len(kind.value) + 1 :].partition(" and ")
                if sep:
                    return cls(kind, block, following)
            if text == kind.value and kind not in _OF_MODULE and kind not in _BETWEEN:
                return cls(kind)
        raise ValueError(f"{text!r} is not an event of the step")

    @property
    def label(self) -> str:
        """The event as plans and reports show it."""
        if self.kind in _BETWEEN:
            return f"{self.kind.value} {self.module} and {self.next_module}"
        if self.kind in _OF_MODULE:
            return f"{self.kind.value} {self.module}"
        return self.kind.value

    @property
    def phase(self) -> Phase | None:
        """The phase outside the blocks this event peaks in, if it is one of those."""
        return _PHASES.get(self.kind)

    def __str__(self) -> str:
        return self.label


OUTSIDE_PHASES = tuple(_OUTSIDE)
"""The phases outside the blocks that have an event of their own, in the step's order of
the profile's events."""
