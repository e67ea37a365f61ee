"""A region's selective policy as a typed value, without torch: parsed once, when a plan loads.

In a plan a policy reads ``{"save": ["aten.mm.default#1"], "offload": ["aten.gelu.default"]}``:
the op calls whose outputs the region keeps, and those it moves to host memory; every other op
call is recomputed. ``Policy.from_json`` and ``Policy.to_json`` keep that spelling, so plans
load as before and a plan's JSON round-trips unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ckptplan.errors import CkptplanError


class Choice(Enum):
    """What a policy does with an op call's output instead of recomputing it (torch's
    ``CheckpointPolicy``, spelled as the plan spells it)."""

    SAVE = "save"
    OFFLOAD = "offload"


@dataclass(frozen=True)
class OpCall:
    """Calls of one op overload in a region: the ``index``-th (counting from 0, per overload,
    as selective checkpointing counts them), or every call when ``index`` is None."""

    op: str
    index: int | None = None

    @staticmethod
    def parse(text: object, region: str = "a region") -> OpCall:
        """``"aten.mm.default#1"``, or ``"aten.mm.default"`` for every call.

        >>> OpCall.parse("aten.mm.default#1")
        OpCall(op='aten.mm.default', index=1)
        >>> str(OpCall.parse("aten.mm.default"))
        'aten.mm.default'
        >>> OpCall.parse("aten.mm.default#x", "b.0")
        Traceback (most recent call last):
        ckptplan.errors.CkptplanError: policy of b.0 names 'aten.mm.default#x'; write op#k, k >= 0
        """
        if not isinstance(text, str):
            raise CkptplanError(
                f"policy of {region} has entry {text!r}; name op calls as strings, "
                "e.g. 'aten.mm.default#0'"
            )
        op, hash_sign, index = text.partition("#")
        if len(op.split(".")) != 3 or not all(op.split(".")):
            raise CkptplanError(
                f"policy of {region} names {op!r}; name ops as namespace.op.overload, "
                "e.g. aten.mm.default"
            )
        if not hash_sign:
            return OpCall(op)
        if not (index.isascii() and index.isdigit()):
            raise CkptplanError(f"policy of {region} names {text!r}; write op#k, k >= 0")
        return OpCall(op, int(index))

    def __str__(self) -> str:
        return self.op if self.index is None else f"{self.op}#{self.index}"

    def after(self, earlier: int) -> OpCall:
        """The call counted where ``earlier`` calls of its op run first: a menu counts calls
        within a block, a policy within its region of blocks.

        >>> str(OpCall("aten.mm.default", 1).after(2))
        'aten.mm.default#3'
        """
        return self if self.index is None else OpCall(self.op, self.index + earlier)

    def matches(self, op: str, index: int) -> bool:
        """Whether the ``index``-th call of ``op`` is one of these calls.

        >>> OpCall("aten.mm.default").matches("aten.mm.default", 3)
        True
        >>> OpCall("aten.mm.default", 1).matches("aten.mm.default", 3)
        False
        """
        return op == self.op and self.index in (None, index)


@dataclass(frozen=True)
class Policy:
    """A region's selective policy: the op calls it keeps and those it offloads."""

    saves: tuple[OpCall, ...] = ()
    offloads: tuple[OpCall, ...] = ()

    def calls(self, choice: Choice) -> tuple[OpCall, ...]:
        """The op calls the policy makes ``choice`` for."""
        return self.saves if choice is Choice.SAVE else self.offloads

    def choice(self, op: str, index: int) -> Choice | None:
        """What the policy does with the ``index``-th call of ``op``; None recomputes it.

        >>> policy = Policy((OpCall("aten.mm.default", 1),), (OpCall("aten.gelu.default"),))
        >>> [policy.choice("aten.mm.default", k) for k in (0, 1)]
        [None, <Choice.SAVE: 'save'>]
        >>> policy.choice("aten.gelu.default", 5)
        <Choice.OFFLOAD: 'offload'>
        """
        for choice in Choice:
            if any(call.matches(op, index) for call in self.calls(choice)):
                return choice
        return None

    @staticmethod
    def from_json(data: object, region: str = "a region") -> Policy:
        """The policy a plan spells ``{"save": [...], "offload": [...]}``; a one-line error for
        anything else.

        >>> Policy.from_json({"save": ["aten.addmm.default#0"]})
        Policy(saves=(OpCall(op='aten.addmm.default', index=0),), offloads=())
        >>> Policy.from_json({"discard": []}, "b.0")
        Traceback (most recent call last):
        ckptplan.errors.CkptplanError: policy of b.0 has 'discard'; ckptplan supports save, offload
        """
        if not isinstance(data, dict):
            raise CkptplanError(
                f"policy of {region} is a {type(data).__name__}; write "
                '{"save": [op calls], "offload": [op calls]}'
            )
        known = [c.value for c in Choice]
        unknown = sorted(str(key) for key in data if key not in known)
        if unknown:
            raise CkptplanError(
                f"policy of {region} has {', '.join(map(repr, unknown))}; ckptplan supports "
                f"{', '.join(known)}"
            )
        calls: dict[Choice, tuple[OpCall, ...]] = {}
        for choice in Choice:
            entries = data.get(choice.value) or []
            if not isinstance(entries, list):
                raise CkptplanError(
                    f"policy of {region} has {choice.value} {entries!r}; write a list of op calls"
                )
            calls[choice] = tuple(OpCall.parse(e, region) for e in entries)
        saves, offloads = calls[Choice.SAVE], calls[Choice.OFFLOAD]
        both = sorted(set(map(str, saves)) & set(map(str, offloads)))
        if both:
            raise CkptplanError(
                f"policy of {region} both saves and offloads {both[0]}; name it once"
            )
        return Policy(saves, offloads)

    def to_json(self) -> dict[str, list[str]]:
        """The plan's spelling: ``save`` always, ``offload`` when the policy offloads.

        >>> Policy.to_json(Policy.from_json({"save": [], "offload": ["aten.mm.default#2"]}))
        {'save': [], 'offload': ['aten.mm.default#2']}
        """
        out = {Choice.SAVE.value: [str(c) for c in self.saves]}
        if self.offloads:
            out[Choice.OFFLOAD.value] = [str(c) for c in self.offloads]
        return out
