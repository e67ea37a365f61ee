"""The chain of units and a plan's regions, each in one line, as reports print them: runs of
like siblings, and of calls of one module (``ckptplan.unit_names``), folded together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ckptplan.plan import Region
from ckptplan.policy_types import Choice, OpCall, Policy
from ckptplan.unit_names import split_unit


def describe_units(paths: list[str], classes: list[str]) -> str:
    """The chain in one line, consecutive siblings of one class (and one call) folded together,
    and consecutive calls of one module.

    >>> describe_units(["enc.0", "enc.1", "dec.0", "s#0", "s#1"], ["L", "L", "B", "S", "S"])
    'enc.0-1 x2 L → dec.0 B → s#0-1 x2 S'
    """
    groups: list[tuple[str, list[str], str, str]] = []  # prefix, names, suffix, class
    for unit, cls in zip(paths, classes, strict=True):
        path, call = split_unit(unit)
        parent, _, name = path.rpartition(".")
        prefix, suffix = f"{parent}." if parent else "", "" if call is None else f"#{call}"
        last = groups[-1] if groups and groups[-1][3] == cls else None
        if last and last[0] == f"{path}#":
            last[1].append(str(call))
        elif last and call is not None and len(last[1]) == 1 and last[0] + last[1][0] == path:
            groups[-1] = (f"{path}#", [last[2][1:], str(call)], "", cls)
        elif last and (last[0], last[2]) == (prefix, suffix):
            last[1].append(name)
        else:
            groups.append((prefix, [name], suffix, cls))
    parts = []
    for prefix, names, suffix, cls in groups:
        run = names[0] if len(names) == 1 else f"{names[0]}-{names[-1]}{suffix} x{len(names)}"
        parts.append(f"{prefix}{run}{suffix if len(names) == 1 else ''} {cls}".rstrip())
    return " → ".join(parts)


def _span(modules: Sequence[str]) -> tuple[str, int, int] | None:
    """``(parent, first, last)`` when ``modules`` are consecutive numbered siblings."""
    parents, indices = set(), []
    for path in modules:
        parent, _, last = path.rpartition(".")
        if not last.isdigit():
            return None
        parents.add(parent)
        indices.append(int(last))
    if len(parents) != 1 or indices != list(range(indices[0], indices[0] + len(indices))):
        return None
    return parents.pop(), indices[0], indices[-1]


def _policy_text(policy: Policy | None, shown: int = 3) -> str:
    if policy is None:
        return ""
    parts = []
    for verb, choice in (("keeps", Choice.SAVE), ("offloads", Choice.OFFLOAD)):
        names = [_short_op(call) for call in policy.calls(choice)]
        if names:
            more = ", ..." if len(names) > shown else ""
            parts.append(f"{verb} {', '.join(names[:shown])}{more}")
    return f" (selective: {'; '.join(parts) or 'keeps nothing'})"


def _short_op(call: OpCall) -> str:
    """``aten.addmm.default#0`` -> ``addmm#0``; other overloads keep their name."""
    op = call.op.removeprefix("aten.").removesuffix(".default")
    return str(OpCall(op, call.index))


@dataclass
class _Run:
    """Consecutive regions of ``size`` numbered siblings each, under one policy."""

    parent: str
    first: int
    last: int
    size: int
    policy: Policy | None
    count: int = 1

    def text(self) -> str:
        prefix = f"{self.parent}." if self.parent else ""
        name = prefix + (
            f"{self.first}" if self.first == self.last else f"{self.first}-{self.last}"
        )
        if self.count > 1:
            name += f" x{self.count}" + (f" of {self.size}" if self.size > 1 else "")
        elif self.size > 1:
            name += " as one"
        return name + _policy_text(self.policy)


def describe_regions(regions: Sequence[Region]) -> str:
    """Checkpointed regions in one line, runs of like regions folded: ``blocks.3-10 x8`` is
    eight regions of one block, ``blocks.0-2 as one`` a region of three, ``blocks.0-7 x4 of 2``
    four regions of two; a selective policy follows its run.

    >>> one, keeps = Region(("b.0", "b.1", "b.2")), Policy((OpCall("aten.mm.default", 0),))
    >>> describe_regions([one, *(Region((f"b.{i}",), policy=keeps) for i in (3, 4))])
    'b.0-2 as one, b.3-4 x2 (selective: keeps mm#0)'
    """
    parts: list[_Run | str] = []
    for region in regions:
        span = None if region.children else _span(region.units)
        if span is None:
            parts.append(_single(region))
            continue
        parent, first, last = span
        run = parts[-1] if parts else None
        if isinstance(run, _Run) and (run.parent, run.last + 1, run.size, run.policy) == (
            parent,
            first,
            last - first + 1,
            region.policy,
        ):
            run.last, run.count = last, run.count + 1
        else:
            parts.append(_Run(parent, first, last, last - first + 1, region.policy))
    return ", ".join(part if isinstance(part, str) else part.text() for part in parts)


def _single(region: Region) -> str:
    if region.children:
        return f"{region.units[0]} whole, {describe_regions(region.children)} inside it"
    first, last = region.units[0], region.units[-1]
    name = first if first == last else f"{first} ... {last} as one"
    return name + _policy_text(region.policy)
