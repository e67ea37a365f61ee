"""The one exception type users see: its message is a complete one-line diagnosis."""

import os
import shlex
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

DEBUG_ENV = "CKPTPLAN_DEBUG"

_CLI: ContextVar[bool] = ContextVar("ckptplan_cli", default=False)

_FLAGS = {"run_on": "--on"}
"""The flag of each Python argument whose flag is not its name with dashes."""


class CkptplanError(Exception):
    """A problem with the user's input, stated in one line with the fix.

    The CLI prints the message and exits with status 2; no traceback is shown.
    """


class BelowLeastPeak(CkptplanError):
    """The budget is below the least peak any plan of the solver reaches (``least_bytes``)."""

    def __init__(self, message: str, least_bytes: int) -> None:
        super().__init__(message)
        self.least_bytes = least_bytes


def option(name: str, value: object = None) -> str:
    """An option as an error message names it in the fix it gives: a Python argument for the
    library's callers, a flag on the command line (``command_line``), its value quoted for the
    shell where it needs it, so the fix pastes as it is.

    >>> option("budget", "4MiB"), option("force", True), option("strategy", "fsdp")
    ("budget='4MiB'", 'force=True', "strategy='fsdp'")
    >>> with command_line():
    ...     option("budget", "4MiB"), option("force", True), option("strategy", "fsdp")
    ('--budget 4MiB', '--force', '--fsdp')
    >>> with command_line():
    ...     option("blocks", "layers.*,head")
    "--blocks 'layers.*,head'"
    """
    if not _CLI.get():
        return name if value is None else f"{name}={value!r}"
    if name == "strategy" and isinstance(value, str):
        return f"--{value}"
    flag = _FLAGS.get(name, "--" + name.replace("_", "-"))
    if value is None or value is True:
        return flag
    if isinstance(value, float):
        return f"{flag} {value:g}"
    return f"{flag} {shlex.quote(str(value))}"


@contextmanager
def command_line() -> Iterator[None]:
    """While active, error messages name flags (``option``): the CLI runs its commands here."""
    token = _CLI.set(True)
    try:
        yield
    finally:
        _CLI.reset(token)


def debug_enabled() -> bool:
    """Whether ``CKPTPLAN_DEBUG`` is set (to anything but empty, 0, false, no or off).

    ``ckptplan --debug`` sets it for the duration of the command. The library may then keep
    the causes of a ``CkptplanError`` (``raise ... from exc`` instead of ``from None``).
    """
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def raised_by_ckptplan(exc: BaseException) -> bool:
    """Whether the deepest frame outside torch is ckptplan's own (a bug here, not in the
    model's code or in what fake tensors support). ckptplan's dispatch modes pass every op
    through, so an op that fails inside one is not counted as theirs; nor is an op that needs
    tensor values fake tensors lack, wherever it is called from (an optimizer's step that
    reads its step count, as Adafactor's does)."""
    if type(exc).__name__ in ("DataDependentOutputException", "DynamicOutputShapeException"):
        return False
    owners = [
        str(frame.f_globals.get("__name__", "")).partition(".")[0]
        for frame, _ in traceback.walk_tb(exc.__traceback__)
        if frame.f_code.co_name != "__torch_dispatch__"
    ]
    outside_torch = [owner for owner in owners if owner != "torch"]
    return bool(outside_torch) and outside_torch[-1] == "ckptplan"
