"""The CLI's error boundary: whatever a command raises ends as one line and an exit status.

0 ok, 1 a ``verify`` check failed, 2 bad input (a ``CkptplanError`` or a flag click refused,
one line with the fix),
3 internal error (a bug in ckptplan or torch: one line naming where, ``--debug`` or
``CKPTPLAN_DEBUG=1`` for the traceback), 130 interrupted.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import click

from ckptplan.errors import DEBUG_ENV, CkptplanError, command_line, debug_enabled

# 0 ok, 1 a verify check failed (verify's sys.exit(1)), then:
EXIT_USER_ERROR, EXIT_INTERNAL_ERROR = 2, 3
EXIT_INTERRUPTED = 130


class UserError(click.ClickException):
    """A CkptplanError as click shows it: one line on stderr, exit status 2."""

    exit_code = EXIT_USER_ERROR

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


def _print_traceback(exc: BaseException) -> None:
    """The traceback of exc with every cause and context, even those ``from None`` hides."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__suppress_context__ = False
        link = link.__cause__ or link.__context__
    click.echo("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)), err=True)


def _user_error(exc: CkptplanError) -> UserError:
    if debug_enabled():
        _print_traceback(exc)
    return UserError(str(exc))


def user_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Show a CkptplanError raised by command as one line, exit status 2.

    Every other exception reaches the group's boundary (``Boundary.invoke``).
    """

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except CkptplanError as exc:
            raise _user_error(exc) from None

    return wrapper


def _frame_path(frame: Any) -> str | None:
    """``ckptplan/<file>.py`` for a frame of the ckptplan package, ``torch`` for torch's."""
    module = str(frame.f_globals.get("__name__", ""))
    root = module.partition(".")[0]
    if root == "torch":
        return "torch"
    if root != "ckptplan":
        return None
    path = module.replace(".", "/")
    if os.path.basename(frame.f_code.co_filename) == "__init__.py":
        return f"{path}/__init__.py"
    return f"{path}.py"


def _where(exc: BaseException) -> str:
    """Where exc was raised: the deepest ckptplan frame, or torch (called from that frame)."""
    deepest: tuple[str, int] | None = None
    in_torch = False
    for frame, line in traceback.walk_tb(exc.__traceback__):
        path = _frame_path(frame)
        if path == "torch":
            in_torch = True
        elif path is not None:
            deepest, in_torch = (path, line), False
    here = f"{deepest[0]}, line {deepest[1]}" if deepest else ""
    if in_torch:
        return f" (in torch, called from {here})" if deepest else " (in torch)"
    return f" (in {here})" if deepest else ""


def internal_error_line(exc: BaseException) -> str:
    """``internal error: Type: first line of message (in ckptplan/x.py, line N)``."""
    try:
        lines = str(exc).strip().splitlines()
    except Exception:
        lines = []
    message = lines[0] if lines else ""
    if len(message) > 300:
        message = message[:297] + "..."
    what = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return f"internal error: {what}{_where(exc)}"


def report_internal(exc: BaseException) -> None:
    try:
        if debug_enabled():
            _print_traceback(exc)
            click.echo(internal_error_line(exc), err=True)
        else:
            click.echo(
                f"{internal_error_line(exc)}; rerun with --debug for the traceback", err=True
            )
    except Exception:  # the boundary itself must not fail with a traceback
        click.echo(f"internal error: {type(exc).__name__}", err=True)


@contextlib.contextmanager
def _debug_env(debug: bool) -> Iterator[None]:
    """Set CKPTPLAN_DEBUG while a ``--debug`` command runs, so the library sees it too."""
    if not debug:
        yield
        return
    previous = os.environ.get(DEBUG_ENV)
    os.environ[DEBUG_ENV] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(DEBUG_ENV, None)
        else:
            os.environ[DEBUG_ENV] = previous


class Boundary(click.Group):
    """The error boundary: whatever a command raises ends as one line and an exit status."""

    def invoke(self, ctx: click.Context) -> Any:
        with _debug_env(bool(ctx.params.get("debug"))), command_line():
            try:
                return super().invoke(ctx)
            except click.UsageError as exc:  # a flag or argument click refused: one line too
                where = exc.ctx.command_path if exc.ctx else ctx.command_path
                click.echo(f"error: {exc.format_message()} (see '{where} -h')", err=True)
                ctx.exit(EXIT_USER_ERROR)
            except (click.ClickException, click.exceptions.Exit, click.Abort):
                raise  # click's own: ctx.exit, aborts, errors it shows itself
            except CkptplanError as exc:  # from a command without @user_errors
                raise _user_error(exc) from None
            except KeyboardInterrupt:
                click.echo("interrupted", err=True)
                ctx.exit(EXIT_INTERRUPTED)
            except Exception as exc:
                if isinstance(exc, OSError) and exc.errno == errno.EPIPE:
                    raise  # click quiets a closed pipe (ckptplan show plan.json | head)
                report_internal(exc)
                ctx.exit(EXIT_INTERNAL_ERROR)
