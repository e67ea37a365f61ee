"""``ckptplan fit``: the largest batch (or sequence length) that fits a budget, with the plan
for each size asked and the size of best predicted throughput. Registered into the CLI group
with ``cli.add_command(fit_command)``; the Python twin is ``ckptplan.fit``."""

from __future__ import annotations

import click

from ckptplan.cli.boundary import UserError, user_errors
from ckptplan.cli.options import (
    MODEL_HELP,
    budget_option,
    model_argument,
    parallel_options,
    solve_options,
    step_options,
)
from ckptplan.cli.output import console, print_json, progress_display
from ckptplan.options import Parallel, ProfileOptions, SolveOptions

__all__ = ["fit_command"]


@click.command("fit", epilog=MODEL_HELP)
@model_argument
@budget_option("Peak memory of a step: 12GB or 12G (10^9 bytes), 11.5GiB (2^30) or 800MB.")
@click.option(
    "--vary",
    type=click.Choice(("batch", "seq-len")),
    default="batch",
    show_default=True,
    help="What grows: the batch, or an hf: model's tokens per sequence (at --batch-size).",
)
@click.option(
    "--max-size",
    type=click.IntRange(min=1),
    default=4096,
    show_default=True,
    help="The largest size asked.",
)
@solve_options
@step_options
@parallel_options
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@user_errors
def fit_command(
    model: str,
    budget: str,
    vary: str,
    max_size: int,
    search: SolveOptions,
    step: ProfileOptions,
    ranks: Parallel,
    as_json: bool,
) -> None:
    """The largest batch (or sequence length) of MODEL whose best plan fits BUDGET."""
    from ckptplan.capacity import fit_with
    from ckptplan.values.budget import parse_budget

    if vary == "batch" and step.batch_size is not None:
        raise UserError("--batch-size is what fit finds; leave it out, or use --vary seq-len")
    with progress_display(as_json) as progress:
        parsed = parse_budget(budget)
        result = fit_with(model, parsed, vary, max_size, step, search, ranks, progress)
    if as_json:
        print_json("fit", result.to_json())
        return
    from ckptplan.cli.report import show_fit

    show_fit(result, console())
