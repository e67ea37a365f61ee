"""The ``ckptplan`` group as ``ckptplan --help`` shows it: the commands in the order of the
work (profile a model, solve a plan, check it, then the tools around it), each with its whole
first sentence, wrapped rather than cut off at click's 45 characters."""

from __future__ import annotations

import click

from ckptplan.cli.boundary import Boundary

WORKFLOW = ("profile", "solve", "fit", "verify", "show", "sweep", "rewrite", "gap", "remat")
"""The commands in the order a new user meets them; any other follows, alphabetically."""


class Commands(Boundary):
    """The error boundary (``Boundary``), with its commands listed in workflow order."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Workflow order, so that ``--help`` reads as the steps of the job."""
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: WORKFLOW.index(n) if n in WORKFLOW else len(WORKFLOW))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Each command's first sentence in full, wrapped to the terminal's width."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=len(command.help or ""))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
