"""Where the blocks of a chain sit around a run of ``L`` identical blocks, for the traces of 3
and 4 of them and for the full model (``ckptplan.profiling.replicate`` makes them,
``ckptplan.profiling.expand`` reads them): each block's role in the run, the slot of the 3-block
trace it copies, and the module paths a cut of the run renames.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class NotReplicable(Exception):
    """The traces are not an exact picture of the whole run; the message says why."""


Role = tuple[int, int]
"""``(0, position in the run)`` for a block of the run, ``(-1, index in the full chain)`` for
any other block."""
Slot = tuple[Role, int | None]
"""A block of the target as the 3-block trace's role it copies, and its position when that
role is the middle."""


@dataclass(frozen=True)
class Layout:
    """Where the blocks of one traced (or the full) chain sit."""

    roles: tuple[Role, ...]
    """The role of each block of the chain, in its order."""
    length: int
    """How many blocks the run has in this chain."""
    paths: tuple[str, ...]
    """Each block's module path in this chain."""
    renames: dict[str, str]
    """Full-model path -> this chain's path of each container child moved by the cut."""

    def index(self, role: Role) -> int:
        return self.roles.index(role)

    def slot(self, unit: int) -> Slot:
        """The 3-block role a block of this chain copies, and its middle position."""
        kind, position = self.roles[unit]
        if kind == -1 or position == 0:
            return (kind, position), None
        if position == self.length - 1:
            return (0, 2), None
        return (0, 1), position

    def unit(self, slot: Slot) -> int:
        (kind, position), copy = slot
        if kind == -1 or position == 0:
            return self.index((kind, position))
        return self.index((0, self.length - 1 if position == 2 else copy))


def owners_of_updates(
    optimizer: torch.optim.Optimizer | None, chain: list[tuple[str, torch.nn.Module]]
) -> tuple[int, ...]:
    """The block (or -1) holding each parameter the optimizer updated, in its order."""
    owner = {id(p): i for i, (_, module) in enumerate(chain) for p in module.parameters()}
    groups = optimizer.param_groups if optimizer is not None else ()
    return tuple(owner.get(id(p), -1) for g in groups for p in g["params"] if p.grad is not None)


def _position(slot: Slot, length: int) -> int:
    (_, position), copy = slot
    return copy if copy is not None else (0 if position == 0 else length - 1)


def _slot_at(position: int, length: int) -> Slot:
    if position == 0:
        return (0, 0), None
    if position == length - 1:
        return (0, 2), None
    if 0 < position < length - 1:
        return (0, 1), position
    raise NotReplicable("a block of the run reads one beyond the run")


def relative(owner: Slot | None, ref: Role | None, length: int) -> Slot | None:
    """The target block that ``owner``'s copy of a reference to ``ref`` names: as many blocks
    away from it as in the trace."""
    if ref is None:
        return None
    if ref[0] == 0 and owner is not None and owner[0][0] == 0:
        return _slot_at(_position(owner, length) + ref[1] - owner[0][1], length)
    if ref == (0, 1):
        raise NotReplicable("code outside the run reads a block in its middle")
    return ref, None


def renamed(path: str, renames: dict[str, str]) -> str:
    for old, new in renames.items():
        if path == old or path.startswith(old + "."):
            return new + path[len(old) :]
    return path
