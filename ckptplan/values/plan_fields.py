"""Plan-file values read and written field by field, keeping what this version does not know.

A plan written by a newer ckptplan may carry keys this one lacks; they are kept in the value's
``extra`` and written back after the known ones, so a plan read and saved again loses nothing.
Plain data, importable without torch.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Literal, TypeVar, Union, cast, get_args, get_origin, get_type_hints

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
    if not isinstance(data, Mapping):
        raise TypeError(f"{cls.__name__} is a {type(data).__name__}, not an object")
    known = known_fields(cls)
    hints = get_type_hints(cls)
    for name in known:
        if name in data and not fits(data[name], hints[name]):
            wanted = _spelling(hints[name])
            raise TypeError(f"{cls.__name__}.{name} is {data[name]!r}, not {wanted}")
    value = cast(Any, cls)(
        **{k: v for k, v in data.items() if k in known},
        extra={k: v for k, v in data.items() if k not in known and k not in derived},
    )
    return cast(V, value)


def _spelling(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def fits(value: object, hint: Any) -> bool:
    """Whether a JSON value can stand for a field of type ``hint``: the scalars, their unions
    and Literals, and lists for tuples; anything richer is left to its own reader.

    >>> fits(3, int), fits(True, int), fits(3, float), fits("3", int | None)
    (True, False, True, False)
    >>> fits(["a", "b"], tuple[str, ...]), fits("ab", tuple[str, ...])
    (True, False)
    """
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(fits(value, arg) for arg in get_args(hint))
    if origin is Literal:
        return value in get_args(hint)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint in (int, float):
        numbers = (int,) if hint is int else (int, float)
        return isinstance(value, numbers) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is tuple:
        element = get_args(hint)[0] if get_args(hint) else Any
        return isinstance(value, list | tuple) and all(fits(v, element) for v in value)
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return isinstance(value, Mapping)
    return True
