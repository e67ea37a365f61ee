"""The chain of units in one line, as reports print it: runs of like siblings, and of calls of
one module (``ckptplan.values.unit_names``), folded together (``ckptplan.cli.regions`` words a
plan's regions).
"""

from __future__ import annotations

from ckptplan.values.unit_names import split_unit


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
