"""What the ``ckptplan`` commands print and where: the console, ``--json``, the progress
spinner, and refusing an output path before the long work."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import click
from rich.console import Console

from ckptplan.cli.boundary import UserError
from ckptplan.progress import QUIET, Progress
from ckptplan.quietlogs import library_noise_quieted


def writable_destination(path: str, flag: str = "-o") -> None:
    """Refuse an output path before the long work, not after it."""
    folder = Path(path).resolve().parent
    if not folder.is_dir():
        raise UserError(f"{flag} {path}: the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise UserError(f"{flag} {path}: the folder {folder} is not writable")


def console(stderr: bool = False) -> Console:
    """A console that wraps at the terminal's width, and not at all into a pipe or file (rich
    would wrap at 80 columns there, breaking a report's lines for grep)."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=10_000, soft_wrap=True)


def print_json(command: str, data: dict[str, Any]) -> None:
    """A command's ``--json`` output, led by the schema it follows (``ckptplan.solve/1``)."""
    click.echo(json.dumps({"schema": f"ckptplan.{command}/1", **data}, indent=2))


class Spinner:
    """A rich status line on stderr naming the phase a command is in; gone when it ends."""

    def __init__(self, stream: Console) -> None:
        self._status = stream.status("starting")

    def phase(self, what: str) -> None:
        self._status.update(f"{what}…")

    def __enter__(self) -> Spinner:
        self._status.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._status.stop()


@contextmanager
def progress_display(as_json: bool) -> Iterator[Progress]:
    """A spinner where a person watches (stdout and stderr both terminals, no ``--json``);
    elsewhere nothing, so that pipes, files and JSON get the report alone. The libraries'
    messages about ckptplan's own steps are dropped meanwhile (``quietlogs``)."""
    with library_noise_quieted():
        if as_json or not (sys.stdout.isatty() and sys.stderr.isatty()):
            yield QUIET
        else:
            with Spinner(Console(stderr=True)) as spinner:
                yield spinner
