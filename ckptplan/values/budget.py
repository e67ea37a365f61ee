"""Memory budgets as users write them (docs/design.md §4), and bytes as users read them.

Units follow Hugging Face accelerate and Kubernetes: ``G``, ``GB`` (and ``K``, ``M``, ``T``
with or without ``B``) are powers of 10, ``Gi``, ``GiB`` powers of 2, so ``12G`` is ``12GB``,
12 * 10**9 bytes, and ``12GiB`` is 12 * 2**30. Case does not matter, except that a lowercase
``b`` after an uppercase prefix means bits (``12Gb``, ``12Mb``, and ``12Gbit`` in any case),
refused with the byte unit to write instead; all-lowercase ``12gb`` is the common typing of
gigabytes, and accepted as such. ``0.6`` or ``60%`` is a fraction of the unchecked step's peak.
A bare whole number is bytes, but one from 2 to 1000 is refused (no training step fits in a
kilobyte: it is a percentage or gigabytes without the unit), before anything is profiled; ``1``
stays one byte, the budget that asks for the least feasible peak (``BelowLeastPeak``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ckptplan.errors import BelowLeastPeak, CkptplanError, option

_PREFIXES = {
    "": (1, ""),
    "k": (10**3, "kilo"),
    "m": (10**6, "mega"),
    "g": (10**9, "giga"),
    "t": (10**12, "tera"),
    "ki": (2**10, "kibi"),
    "mi": (2**20, "mebi"),
    "gi": (2**30, "gibi"),
    "ti": (2**40, "tebi"),
}
_UNITS = {p + b: size for p, (size, _) in _PREFIXES.items() for b in ("b", "") if p + b}
_BIT_SUFFIXES = ("bits", "bit", "b")
_SLIPS = range(2, 1001)
"""Bare numbers refused as a unit left out: a percentage, megabytes or gigabytes."""
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z%]*)\s*$", re.IGNORECASE)
_EXAMPLES = "write e.g. 12GB, 11.5GiB, 800MB, 3000000000, 0.6 or 60% (of the unchecked peak)"


@dataclass(frozen=True)
class Budget:
    """A parsed budget: either absolute bytes or a fraction of the unchecked peak."""

    text: str
    bytes: int | None = None
    fraction: float | None = None

    def resolve(self, unchecked_peak: int) -> int:
        """Bytes this budget allows, given the peak of the step without checkpointing."""
        if self.bytes is not None:
            return self.bytes
        assert self.fraction is not None
        return int(self.fraction * unchecked_peak)

    def resolved(self, unchecked_peak: int, scope: str, margin_percent: float) -> ResolvedBudget:
        """This budget in bytes for a step of ``unchecked_peak``, holding ``margin_percent``
        of it back."""
        return ResolvedBudget(self.text, self.resolve(unchecked_peak), scope, margin_percent)


@dataclass(frozen=True)
class ResolvedBudget:
    """One solve's budget, made once and passed down to the plan that records it: as the user
    wrote it, in bytes, what it holds (``step`` or ``activations``), the percent held back
    (``--margin``, ``ckptplan.devices.held_back_percent``) and the peak a plan aims at.

    >>> ResolvedBudget("1000", 1000, margin_percent=3.0).aim
    970
    """

    text: str
    bytes: int
    scope: str = "step"
    margin_percent: float = 0.0

    @property
    def aim(self) -> int:
        """The peak a plan must reach: the budget less what it holds back."""
        return self.bytes - round(self.bytes * self.margin_percent / 100)

    def at_least(self, peak: int) -> str:
        """The ``--budget`` to ask for instead, rounded up, whose aim holds ``peak``."""
        return format_budget_at_least(admitting_budget(peak, self.margin_percent))

    def below_least_peak(self, least: int, of: str, advice: str = "") -> BelowLeastPeak:
        """The refusal of this budget where no plan reaches below ``least`` bytes: the one
        message for it, whoever refuses (``solve``, a pipeline's stage, ``fit``, ``autoplan``).

        >>> budget = ResolvedBudget("1MB", 10**6, margin_percent=3.0)
        >>> print(budget.below_least_peak(2**20, "m"))  # doctest: +NORMALIZE_WHITESPACE
        budget 976.56 KiB less its 3% margin is below the least feasible peak 1.00 MiB of m;
        use budget='1.04MiB' or more
        """
        held = f" less its {self.margin_percent:g}% margin" if self.margin_percent else ""
        return BelowLeastPeak(
            f"budget {format_bytes(self.bytes)}{held} is below the least feasible peak "
            f"{format_bytes(least)} of {of}; use {option('budget', self.at_least(least))} or "
            f"more{advice}",
            least,
        )


def parse_budget(text: str) -> Budget:
    """Parse ``--budget``; a malformed value is a one-line error that shows the accepted forms."""
    match = _PATTERN.match(str(text))
    if not match:
        raise CkptplanError(f"cannot parse budget {text!r}: {_EXAMPLES}")
    number, unit = float(match.group(1)), match.group(2).lower()
    if number <= 0:
        raise CkptplanError(f"budget {text!r} must be positive: {_EXAMPLES}")
    if unit == "%":
        if number > 1000:
            raise CkptplanError(f"budget {text!r} is not a sensible percentage: {_EXAMPLES}")
        return Budget(text, fraction=number / 100)
    if unit == "":
        if number < 1 or (number == 1 and "." in match.group(1)):
            return Budget(text, fraction=number)
        if number != int(number):
            raise CkptplanError(f"budget {text!r}: bare numbers are whole bytes; {_EXAMPLES}")
        if int(number) in _SLIPS:
            raise CkptplanError(f"budget {text!r} is {int(number)} bytes: {_slip_hint(number)}")
        return Budget(text, bytes=int(number))
    _refuse_bits(text, match.group(1), match.group(2))
    if unit not in _UNITS:
        raise CkptplanError(f"unknown unit {match.group(2)!r} in budget {text!r}: {_EXAMPLES}")
    return Budget(text, bytes=int(number * _UNITS[unit]))


def _slip_hint(number: float) -> str:
    """What a bare number of bytes too small for any step most likely meant."""
    n = int(number)
    return f"did you mean {n}% or {n}GB?" if n <= 100 else f"did you mean {n}MB or {n}GB?"


def _refuse_bits(text: str, number: str, unit: str) -> None:
    """Refuse a unit of bits (``Gb``, ``Mbit``): a budget in bits is eight times off."""
    lower = unit.lower()
    suffix = next((s for s in _BIT_SUFFIXES if lower.endswith(s)), None)
    if suffix is None or (suffix == "b" and (unit == lower or unit.endswith("B"))):
        return
    prefix = lower[: -len(suffix)]
    if prefix in _PREFIXES:
        name = _PREFIXES[prefix][1]
        right = f"{number}{prefix.capitalize()}B"
        raise CkptplanError(f"budget {text!r} is {name}bits; write {right} for {name}bytes")


def admitting_budget(peak: int, margin_percent: float) -> int:
    """The least budget whose share outside a margin of ``margin_percent`` holds ``peak``.

    >>> admitting_budget(990, 1.0)
    1000
    """
    return math.ceil(peak / (1 - margin_percent / 100))


def format_budget_at_least(n: int) -> str:
    """A ``--budget`` value, rounded up, that admits ``n`` bytes."""
    unit, size = ("GiB", 2**30) if n >= 2**30 else ("MiB", 2**20)
    return f"{math.ceil(n / size * 100) / 100:.2f}{unit}"


_SHOWN_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def format_bytes(n: float, like: float | None = None) -> str:
    """Bytes in the binary unit a person reads best for ``n``, or for ``like`` (the largest
    figure of a line or a table, so that it reads in one unit); a figure far below ``like``
    keeps two significant digits.

    >>> format_bytes(3 * 2**30), format_bytes(512 * 2**20, like=3 * 2**30)
    ('3.00 GiB', '0.50 GiB')
    >>> format_bytes(12 * 2**20, like=3 * 2**30), format_bytes(0, like=2**20)
    ('0.012 GiB', '0.00 MiB')
    """
    scale = abs(n if like is None else like)
    for unit, size in _SHOWN_UNITS:
        if scale >= size:
            value = n / size
            small = 0 < abs(value) < 0.1
            decimals = 1 - math.floor(math.log10(abs(value))) if small else 2
            return f"{value:.{decimals}f} {unit}"
    return f"{int(n)} B"
