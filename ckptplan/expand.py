"""A profile of a run of ``L`` identical blocks, extrapolated from traces of 3 and 4 of them.

``ckptplan.replicate`` says when blocks are identical and why extrapolating is exact. Here:

- integers (bytes) are affine: a figure of the run's block at position ``q`` (1 to ``L - 2``,
  the middle) is the 3-block trace's middle one, plus ``q - 1`` times its step between the
  4-block trace's two middle blocks, plus ``L - 3`` times its step from the 3-block trace to
  the 4-block one; figures of the first and last block and outside the run take the last term
  alone. Anything else (flags, names, shapes) must be the same in every trace;
- op records: the middle block's phases (and, in the optimizer step, its parameters' updates)
  are copied once per middle block, forward ones in order, backward ones in reverse, each
  copy's module names, phases and producer indices moved to its own block;
- FLOPs and times are summed from those records as the profiler sums them.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, replace
from typing import Any

import torch

from ckptplan.costs import phase_totals
from ckptplan.profile_types import BlockProfile, OpRecord, Profile

Role = tuple[int, int]
"""``(0, position in the run)`` for a block of the run, ``(-1, index in the full chain)`` for
any other block."""
Slot = tuple[Role, int | None]
"""A block of the target as the 3-block trace's role it copies, and its position when that
role is the middle."""


class NotReplicable(Exception):
    """The traces are not an exact picture of the whole run; the message says why."""


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


def _relative(owner: Slot | None, ref: Role | None, length: int) -> Slot | None:
    """The target block that ``owner``'s copy of a reference to ``ref`` names: as many blocks
    away from it as in the trace."""
    if ref is None:
        return None
    if ref[0] == 0 and owner is not None and owner[0][0] == 0:
        return _slot_at(_position(owner, length) + ref[1] - owner[0][1], length)
    if ref == (0, 1):
        raise NotReplicable("code outside the run reads a block in its middle")
    return ref, None


def _affine(base: Any, steps: list[tuple[Any, Any, int]]) -> Any:
    """``base`` plus ``factor`` times ``a - b`` for each step, for every integer inside it;
    floats are left (the caller sums them from records); anything else must not change."""
    plain = not isinstance(base, int | float | tuple) and not dataclasses.is_dataclass(base)
    if isinstance(base, bool) or plain:
        if any(a != base or b != base for a, b, _ in steps):
            raise NotReplicable(f"{base!r} changes with the run's length")
        return base
    if isinstance(base, float):
        return base
    if isinstance(base, int):
        return base + sum((a - b) * factor for a, b, factor in steps)
    if isinstance(base, tuple):
        if any(len(a) != len(base) or len(b) != len(base) for a, b, _ in steps):
            raise NotReplicable("a list of figures changes its length with the run's")
        return tuple(_affine(x, [(a[i], b[i], f) for a, b, f in steps]) for i, x in enumerate(base))
    if any(type(a) is not type(base) or type(b) is not type(base) for a, b, _ in steps):
        raise NotReplicable(f"a {type(base).__name__} comes and goes with the run's length")
    return replace(
        base,
        **{
            f.name: _affine(
                getattr(base, f.name),
                [(getattr(a, f.name), getattr(b, f.name), k) for a, b, k in steps],
            )
            for f in dataclasses.fields(base)
        },
    )


_LABEL = re.compile(r"(fwd|bwd):(gap)?(\d+)$")


def _unit_of(label: str) -> int | None:
    match = _LABEL.match(label)
    return None if match is None else int(match[3])


def _relabel(label: str, unit: int | None) -> str:
    match = _LABEL.match(label)
    return label if match is None or unit is None else f"{match[1]}:{match[2] or ''}{unit}"


def _step_role(role: Role) -> Role:
    """The 4-block trace's role for a 3-block one outside the middle."""
    return (0, 3) if role == (0, 2) else role


@dataclass(frozen=True)
class _Piece:
    """A stretch of the 3-block trace: a phase's figures (``records`` None) or its records."""

    label: str
    owner: int | None
    """The block it belongs to (its index in the trace), or None outside the blocks."""
    records: range | None = None
    kind: tuple[Any, ...] = ()
    """What it is whichever block it belongs to: its records and those of the same kind of
    another block of the run correspond one to one."""


class _Expansion:
    """The 3-block trace ``base`` and the 4-block ``step``, expanded to the ``target`` chain."""

    def __init__(
        self,
        base: tuple[Profile, Layout, tuple[int, ...]],
        step: tuple[Profile, Layout, tuple[int, ...]],
        target: Layout,
    ) -> None:
        (self.base, self.layout, self.owners), (self.step, self.steps, _) = base, step
        self.target = target
        self.length = target.length
        self.middle = self.layout.index((0, 1))
        self.phases = {
            id(prof): {label: (start, peak) for label, start, peak in prof.phases}
            for prof in (self.base, self.step)
        }
        self.container_paths = {new: old for old, new in self.layout.renames.items()}

    def value(self, slot: Slot | None, pick: Any) -> Any:
        """The figure ``pick(profile, block index)`` of ``slot``'s block in the target."""
        grow = self.length - 3
        if slot is None:
            b = pick(self.base, None)
            return _affine(b, [(pick(self.step, None), b, grow)])
        role, copy = slot
        b = pick(self.base, self.layout.index(role))
        if copy is None:
            return _affine(b, [(pick(self.step, self.steps.index(_step_role(role))), b, grow)])
        s1 = pick(self.step, self.steps.index((0, 1)))
        s2 = pick(self.step, self.steps.index((0, 2)))
        return _affine(b, [(s2, s1, copy - 1), (s1, b, grow)])

    def slot(self, owner: int | None, copy: int | None) -> Slot | None:
        if owner is None:
            return None
        return (self.layout.roles[owner], copy) if copy is not None else self.layout.slot(owner)

    def pieces(self) -> list[_Piece]:
        by_phase: dict[str, list[int]] = {}
        for i, record in enumerate(self.base.ops):
            by_phase.setdefault(record.phase, []).append(i)
        pieces = []
        for label, *_ in self.base.phases:
            indices = by_phase.pop(label, [])
            owner = _unit_of(label)
            pieces.append(_Piece(label, owner))
            if label == "opt":
                pieces += self._updates(indices)
            elif indices:
                kind = (_relabel(label, -1),)
                pieces.append(_Piece(label, owner, range(indices[0], indices[-1] + 1), kind))
        if by_phase:
            raise NotReplicable("ops ran outside the step's phases")
        return pieces

    def _updates(self, indices: list[int]) -> list[_Piece]:
        """The optimizer step's records, cut into each updated parameter's ops (the same ops
        for every parameter, between what the step does once before and after them)."""
        if not indices:
            return []
        start, stop = indices[0], indices[-1] + 1
        grown = sum(r.phase == "opt" for r in self.step.ops) - len(indices)
        per_block = self.owners.count(self.middle)
        if not per_block:
            if grown:
                raise NotReplicable("the optimizer step grows with blocks it does not update")
            return [_Piece("opt", None, range(start, stop), ("opt",))]
        each, rest = divmod(grown, per_block)
        names = [r.op for r in self.base.ops[start:stop]]
        updates = each * len(self.owners)
        head = next(
            (
                h
                for h in range(len(names) - updates + 1)
                if rest == 0 and all(names[h + k] == names[h + k % each] for k in range(updates))
            ),
            None,
        )
        if head is None:
            raise NotReplicable("the optimizer's ops are not the same for every parameter")
        first = start + head
        pieces = [_Piece("opt", None, range(start, first), ("opt", "before"))]
        for k, owner in enumerate(self.owners):
            ordinal = self.owners[:k].count(owner) if owner != -1 else k
            span = range(first + k * each, first + (k + 1) * each)
            pieces.append(_Piece("opt", None if owner == -1 else owner, span, ("opt", ordinal)))
        return [*pieces, _Piece("opt", None, range(first + updates, stop), ("opt", "after"))]

    def module(self, path: str, slot: Slot | None) -> str:
        for unit, unit_path in enumerate(self.layout.paths):
            if path == unit_path or path.startswith(unit_path + "."):
                ref = _relative(slot, self.layout.roles[unit], self.length)
                assert ref is not None
                return self.target.paths[self.target.unit(ref)] + path[len(unit_path) :]
        return renamed(renamed(path, self.container_paths), self.target.renames)

    def build(self) -> tuple[list[tuple[str, int, int]], list[OpRecord]]:
        """The target's phases and records, in the order the step runs them."""
        pieces = self.pieces()
        where: dict[int, tuple[tuple[Any, ...], int, Role | None]] = {}
        for piece in pieces:
            role = None if piece.owner is None else self.layout.roles[piece.owner]
            for offset, i in enumerate(piece.records or ()):
                where[i] = (piece.kind, offset, role)
        phases: list[tuple[str, int, int]] = []
        records: list[OpRecord] = []
        placed: dict[tuple[Any, ...], int] = {}
        k = 0
        while k < len(pieces):
            if pieces[k].owner != self.middle:
                self._emit(pieces[k], None, phases, records, placed, where)
                k += 1
                continue
            end = k
            while end < len(pieces) and pieces[end].owner == self.middle:
                end += 1
            copies = range(1, self.length - 1)
            for copy in reversed(copies) if pieces[k].label.startswith("bwd:") else copies:
                for piece in pieces[k:end]:
                    self._emit(piece, copy, phases, records, placed, where)
            k = end
        return phases, records

    def _emit(
        self,
        piece: _Piece,
        copy: int | None,
        phases: list[tuple[str, int, int]],
        records: list[OpRecord],
        placed: dict[tuple[Any, ...], int],
        where: dict[int, tuple[tuple[Any, ...], int, Role | None]],
    ) -> None:
        """Append the piece's phase or records, as ``slot``'s block has them; ``placed`` finds
        a record of the target by its kind, offset and block."""
        slot = self.slot(piece.owner, copy)
        label = _relabel(piece.label, None if slot is None else self.target.unit(slot))
        if piece.records is None:
            start, peak = self.value(
                slot, lambda prof, u: self.phases[id(prof)][_relabel(piece.label, u)]
            )
            phases.append((label, start, peak))
            return
        for offset, i in enumerate(piece.records):
            record = self.base.ops[i]
            inputs = []
            for j in record.inputs:
                kind, at, role = where[j]
                key = (kind, at, _relative(slot, role, self.length))
                if key not in placed:
                    raise NotReplicable("an op reads one that runs after it in the whole step")
                inputs.append(placed[key])
            placed[(piece.kind, offset, slot)] = len(records)
            records.append(
                replace(
                    record,
                    phase=label,
                    module=self.module(record.module, slot),
                    inputs=tuple(inputs),
                )
            )


def renamed(path: str, renames: dict[str, str]) -> str:
    for old, new in renames.items():
        if path == old or path.startswith(old + "."):
            return new + path[len(old) :]
    return path


def expanded(
    base: tuple[Profile, Layout, tuple[int, ...]],
    step: tuple[Profile, Layout, tuple[int, ...]],
    target: Layout,
    fields: dict[str, Any],
) -> Profile:
    """The profile of the ``target`` chain from the 3-block trace and the 4-block one, each
    with its layout and the owners of the parameters its optimizer updated; ``fields`` are
    the target model's own (its fingerprint, its modules)."""
    plan = _Expansion(base, step, target)
    phases, records = plan.build()
    flops, seconds = phase_totals(records)
    blocks = []
    for unit, path in enumerate(target.paths):
        slot = target.slot(unit)
        block: BlockProfile = plan.value(slot, lambda prof, u: replace(prof.blocks[u], path=""))
        gap = block.gap and replace(block.gap, fwd_time=seconds.get(f"fwd:gap{unit}", 0.0))
        blocks.append(
            replace(
                block,
                path=path,
                flops_fwd=flops[f"fwd:{unit}"],
                flops_bwd=flops[f"bwd:{unit}"],
                time_fwd=seconds[f"fwd:{unit}"],
                time_bwd=seconds[f"bwd:{unit}"],
                gap=gap,
            )
        )
    profile = plan.base
    scaled = {
        name: plan.value(None, lambda prof, u, name=name: getattr(prof, name))
        for name in (
            "parameter_bytes",
            "optimizer_bytes",
            "input_bytes",
            "persistent_bytes",
            "trainable_bytes",
            "region_state_bytes",
            "tail_peaks",
            "fixed_peaks",
            "event_grads",
        )
    }
    enclosures = []
    for enclosure in profile.enclosures:
        first, last = plan.layout.slot(enclosure.start), plan.layout.slot(enclosure.end - 1)
        if first[1] is not None or last[1] is not None:
            raise NotReplicable("a module encloses part of the run")
        enclosures.append(
            replace(
                enclosure,
                path=plan.module(enclosure.path, None),
                start=target.unit(first),
                end=target.unit(last) + 1,
            )
        )
    return replace(
        profile,
        **scaled,
        **fields,
        blocks=tuple(blocks),
        peak_bytes=max(peak for _, _, peak in phases),
        step_time=sum(seconds.values()),
        flops=sum(flops.values()),
        phases=tuple(phases),
        ops=tuple(records),
        enclosures=tuple(enclosures),
    )
