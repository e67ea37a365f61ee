"""Plan-file values read and written field by field, keeping what this version does not know.

A plan written by a newer ckptplan may carry keys this one lacks; they are kept in the value's
``extra`` and written back after the known ones, so a plan read and saved again loses nothing.
Plain data, importable without torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar, cast

V = TypeVar("V")


def known_fields(cls: type) -> tuple[str, ...]:
    """The fields of a plan value that its JSON spells, in order (``extra`` is not one)."""
    return tuple(f.name for f in fields(cls) if f.name != "extra")


def value_from_json(cls: type[V], data: Mapping[str, Any], derived: tuple[str, ...] = ()) -> V:
    """``cls`` from its JSON: known keys as fields, ``derived`` ones (computed from the others,
    written for readers) dropped, the rest in ``extra``.

    >>> from dataclasses import dataclass, field
    >>> @dataclass(frozen=True)
    ... class Point:
    ...     x: int
    ...     extra: Mapping[str, Any] = field(default_factory=dict)
    >>> value_from_json(Point, {"x": 1, "colour": "red"})
    Point(x=1, extra={'colour': 'red'})
    """
    known = known_fields(cls)
    value = cast(Any, cls)(
        **{k: v for k, v in data.items() if k in known},
        extra={k: v for k, v in data.items() if k not in known and k not in derived},
    )
    return cast(V, value)
