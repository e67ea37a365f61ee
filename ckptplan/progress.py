"""Which phase a long command is in, told without the library knowing who listens.

Library functions take a ``Progress`` and call ``phase`` as they move from one phase to the
next (profiling, solving, confirming on fake tensors, measuring); what they return never
depends on it. The CLI passes a spinner on a terminal; everyone else gets ``QUIET``.
"""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def phase(self, what: str) -> None:
        """``what`` is starting now (a lower-case phrase: "profiling one step on fake tensors")."""


class Quiet:
    """Shows nothing: a pipe, a file, ``--json``, or a caller that did not ask."""

    def phase(self, what: str) -> None:
        """Nothing to show."""


QUIET = Quiet()
