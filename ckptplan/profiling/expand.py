"""A profile of a run of ``L`` identical blocks, extrapolated from traces of 3 and 4 of them.

``ckptplan.profiling.replicate`` says when blocks are identical and why extrapolating is exact.
Here:

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
from dataclasses import dataclass, replace
from typing import Any

from ckptplan.profiling.costs import phase_totals
from ckptplan.profiling.runlayout import Layout, NotReplicable, Role, Slot, relative, renamed
from ckptplan.values.phase import Direction, Phase, Where
from ckptplan.values.profile_types import BlockProfile, OpRecord, Profile


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


def _moved(phase: Phase, unit: int | None) -> Phase:
    """``phase`` of block ``unit`` (or the gap after it); outside the blocks, itself."""
    return phase if unit is None else phase.moved(unit)


def _step_role(role: Role) -> Role:
    """The 4-block trace's role for a 3-block one outside the middle."""
    return (0, 3) if role == (0, 2) else role


@dataclass(frozen=True)
class _Piece:
    """A stretch of the 3-block trace: a phase's figures (``records`` None) or its records."""

    phase: Phase
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
            id(prof): {Phase.parse(label): (start, peak) for label, start, peak in prof.phases}
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
            phase = Phase.parse(label)
            pieces.append(_Piece(phase, phase.index))
            if phase == Phase.optimizer():
                pieces += self._updates(indices)
            elif indices:
                kind = (phase.where, phase.direction)
                span = range(indices[0], indices[-1] + 1)
                pieces.append(_Piece(phase, phase.index, span, kind))
        if by_phase:
            raise NotReplicable("ops ran outside the step's phases")
        return pieces

    def _updates(self, indices: list[int]) -> list[_Piece]:
        """The optimizer step's records, cut into each updated parameter's ops (the same ops
        for every parameter, between what the step does once before and after them)."""
        if not indices:
            return []
        start, stop = indices[0], indices[-1] + 1
        optimizer = Phase.optimizer()
        grown = sum(r.phase == optimizer.label for r in self.step.ops) - len(indices)
        per_block = self.owners.count(self.middle)
        if not per_block:
            if grown:
                raise NotReplicable("the optimizer step grows with blocks it does not update")
            return [_Piece(optimizer, None, range(start, stop), (Where.OPTIMIZER,))]
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
        pieces = [_Piece(optimizer, None, range(start, first), (Where.OPTIMIZER, "before"))]
        for k, owner in enumerate(self.owners):
            ordinal = self.owners[:k].count(owner) if owner != -1 else k
            span = range(first + k * each, first + (k + 1) * each)
            kind = (Where.OPTIMIZER, ordinal)
            pieces.append(_Piece(optimizer, None if owner == -1 else owner, span, kind))
        after = range(first + updates, stop)
        return [*pieces, _Piece(optimizer, None, after, (Where.OPTIMIZER, "after"))]

    def module(self, path: str, slot: Slot | None) -> str:
        for unit, unit_path in enumerate(self.layout.paths):
            if path == unit_path or path.startswith(unit_path + "."):
                ref = relative(slot, self.layout.roles[unit], self.length)
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
            for copy in reversed(copies) if pieces[k].phase.is_backward else copies:
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
        label = _moved(piece.phase, None if slot is None else self.target.unit(slot)).label
        if piece.records is None:
            start, peak = self.value(
                slot, lambda prof, u: self.phases[id(prof)][_moved(piece.phase, u)]
            )
            phases.append((label, start, peak))
            return
        for offset, i in enumerate(piece.records):
            record = self.base.ops[i]
            inputs = []
            for j in record.inputs:
                kind, at, role = where[j]
                key = (kind, at, relative(slot, role, self.length))
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
        after = Phase.gap(Direction.FORWARD, unit).label
        gap = block.gap and replace(block.gap, fwd_time=seconds.get(after, 0.0))
        forward, backward = Phase.forward(unit).label, Phase.backward(unit).label
        blocks.append(
            replace(
                block,
                path=path,
                flops_fwd=flops[forward],
                flops_bwd=flops[backward],
                time_fwd=seconds[forward],
                time_bwd=seconds[backward],
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
