"""Memory budgets as users write them (DESIGN.md section 3), and bytes as users read them.

Units follow Hugging Face accelerate: ``GB``/``MB`` are powers of 10, ``GiB``/``MiB`` powers of
2, a bare integer is bytes, and ``0.6`` or ``60%`` is a fraction of the unchecked step's peak.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ckptplan.errors import CkptplanError

_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
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
        return Budget(text, bytes=int(number))
    if unit not in _UNITS:
        raise CkptplanError(f"unknown unit {match.group(2)!r} in budget {text!r}: {_EXAMPLES}")
    return Budget(text, bytes=int(number * _UNITS[unit]))


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
