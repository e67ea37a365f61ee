"""The one exception type users see: its message is a complete one-line diagnosis."""

import os

DEBUG_ENV = "CKPTPLAN_DEBUG"


class CkptplanError(Exception):
    """A problem with the user's input, stated in one line with the fix.

    The CLI prints the message and exits with status 2; no traceback is shown.
    """


class BelowLeastPeak(CkptplanError):
    """The budget is below the least peak any plan of the solver reaches (``least_bytes``)."""

    def __init__(self, message: str, least_bytes: int) -> None:
        super().__init__(message)
        self.least_bytes = least_bytes


def debug_enabled() -> bool:
    """Whether ``CKPTPLAN_DEBUG`` is set (to anything but empty, 0, false, no or off).

    ``ckptplan --debug`` sets it for the duration of the command. The library may then keep
    the causes of a ``CkptplanError`` (``raise ... from exc`` instead of ``from None``).
    """
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")
