"""Old spellings of the API, still taken for one release: each with one ``DeprecationWarning``
of one form, "X is deprecated; use Y", made by ``deprecated``. No torch, none of the planner:
the runtime's ``apply`` uses it too.

``old_spellings`` rewrites a call's old keywords into the new ones before the function sees
them, so ``inspect.signature`` and ``help()`` show only the new (the wrapper's own
``**kwargs`` is behind ``__wrapped__``):

- a renamed keyword, ``device=`` (now ``target=`` to plan for, ``run_on=`` to run on);
- ``parallel="fsdp"``, now ``strategy="fsdp"``;
- an options object for a whole concern (``profile_options=ProfileOptions(...)``,
  ``solve_options=``, ``parallel=Parallel(...)``, ``solver_options=``): its fields, which are
  keywords of the same names.

``moved_to`` sends a call that has become another function's to it: ``apply(model,
budget=...)`` is ``autoplan(model, budget=...)`` now.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])

REMOVED_IN = "0.2"
"""The release that drops the old spellings."""

OPTIONS_OBJECTS = ("profile_options", "solve_options", "parallel", "solver_options")
"""Keywords that took an options object for a concern; its fields are keywords now."""


def deprecated(old: str, new: str, stacklevel: int = 2) -> None:
    """Warn that ``old`` is deprecated and ``new`` is its spelling now; ``stacklevel`` as for
    ``warnings.warn`` from the caller's frame.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     deprecated("solve(device=...)", "solve(target=...)")
    >>> str(caught[0].message)
    'solve(device=...) is deprecated and goes in ckptplan 0.2; use solve(target=...)'
    """
    warnings.warn(
        f"{old} is deprecated and goes in ckptplan {REMOVED_IN}; use {new}",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def fields_of(config: object) -> dict[str, Any]:
    """An options object's fields by name, those of the options objects inside it in its place.

    >>> from dataclasses import dataclass, field
    >>> @dataclass
    ... class Inner:
    ...     every: int = 2
    >>> @dataclass
    ... class Outer:
    ...     solver: str = "auto"
    ...     inner: Inner = field(default_factory=Inner)
    >>> fields_of(Outer())
    {'solver': 'auto', 'every': 2}
    """
    values: dict[str, Any] = {}
    for entry in dataclasses.fields(cast(Any, config)):
        value = getattr(config, entry.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            values.update(fields_of(value))
        else:
            values[entry.name] = value
    return values


def old_spellings(**renames: str) -> Callable[[F], F]:
    """Take the old keywords of a function (module docstring) and call it with the new ones;
    ``renames`` maps an old keyword to its new name. Naming a setting twice, once in each
    spelling, is a TypeError, as Python's own for a keyword given twice; a keyword given
    beside an old options object wins over its field, as it did."""

    def decorate(function: F) -> F:
        name = function.__name__

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    deprecated(f"{name}({old}=...)", f"{name}({new}=...)")
                    _give(name, kwargs, {new: kwargs.pop(old)})
            for old in OPTIONS_OBJECTS:
                value = kwargs.get(old)
                if isinstance(value, str) and old == "parallel":
                    deprecated(f"{name}(parallel={value!r})", f"{name}(strategy={value!r})")
                    _give(name, kwargs, {"strategy": kwargs.pop(old)})
                elif dataclasses.is_dataclass(value) and not isinstance(value, type):
                    kind = type(value).__name__
                    deprecated(f"{name}({old}={kind}(...))", f"its fields as keywords of {name}")
                    for key, field_value in fields_of(kwargs.pop(old)).items():
                        kwargs.setdefault(key, field_value)  # a keyword given wins, as it did
                elif old in kwargs and value is None:
                    kwargs.pop(old)
            return function(*args, **kwargs)

        return cast(F, wrapper)

    return decorate


def _give(function: str, kwargs: dict[str, Any], new: dict[str, Any]) -> None:
    """Add the new spellings of an old keyword's settings to a call's keywords."""
    for key, value in new.items():
        if key in kwargs:
            raise TypeError(f"{function}() got {key}= twice: in its old spelling and its new")
        kwargs[key] = value


def moved_to(other: Callable[..., Any], keyword: str, old: str, new: str) -> Callable[[F], F]:
    """Send a call that passes ``keyword`` to ``other``, whose job it is now, with every
    argument as given, warning that ``old`` is ``new`` now."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if keyword in kwargs:
                deprecated(old, new)
                return other(*args, **kwargs)
            return function(*args, **kwargs)

        return cast(F, wrapper)

    return decorate
