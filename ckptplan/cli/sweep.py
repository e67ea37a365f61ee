"""``ckptplan sweep``: the frontier of every strategy, as a table, a terminal plot, figures
and plan files. Registered into the CLI group with ``cli.add_command(sweep_command)``."""

from __future__ import annotations

import click

from ckptplan.cli.boundary import user_errors
from ckptplan.cli.options import (
    MODEL_HELP,
    budget_option,
    model_argument,
    run_on_option,
    step_options,
    tune_for_timing,
)
from ckptplan.cli.output import console, print_json, progress_display, writable_destination
from ckptplan.options import ProfileOptions

__all__ = ["sweep_command"]


@click.command("sweep", epilog=MODEL_HELP)
@model_argument
@click.option(
    "--points",
    type=click.IntRange(min=1),
    default=6,
    show_default=True,
    help="Points of the dp and auto frontiers.",
)
@budget_option("Mark this budget (as for solve) in the table and the plots.", required=False)
@click.option(
    "--verify",
    "run_verify",
    is_flag=True,
    help="Also run every point for real: measured peak and step time.",
)
@run_on_option("With --verify, the local device to measure on (cpu, cuda) [default: cuda if any].")
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="With --verify, timed steps per point (the median counts).",
)
@click.option(
    "--plot",
    "plots",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="Save the frontier as an image (.png or .svg); repeatable.",
)
@click.option(
    "--save-plans",
    type=click.Path(file_okay=False),
    default=None,
    help="Write every point's plan into this folder (STRATEGY-PEAK.json).",
)
@step_options
@click.option("--json", "as_json", is_flag=True, help="Print the points as JSON.")
@user_errors
def sweep_command(
    model: str,
    points: int,
    budget: str | None,
    run_verify: bool,
    run_on: str | None,
    repeats: int,
    plots: tuple[str, ...],
    save_plans: str | None,
    step: ProfileOptions,
    as_json: bool,
) -> None:
    """The memory/step-time frontier of every strategy: none, full, every-k, sqrt, dp, auto."""
    from ckptplan.api import load_workload, settings_of
    from ckptplan.cli.report import show_sweep
    from ckptplan.values.budget import parse_budget
    from ckptplan.verifying.sweep import SweepOptions, sweep
    from ckptplan.verifying.sweep import save_plans as write_plans
    from ckptplan.verifying.sweep_plot import save_plot, terminal_plot

    for path in plots:
        writable_destination(path, "--plot")
    if run_verify or step.measure:
        tune_for_timing()
    parsed = parse_budget(budget) if budget is not None else None
    workload = load_workload(model)
    options = SweepOptions(points=points, verify=run_verify, repeats=repeats, run_on=run_on)
    with progress_display(as_json) as progress:
        result = sweep(workload, settings_of(step), options, progress)
    budget_bytes = parsed.resolve(result.unchecked_peak_bytes) if parsed else None
    for path in plots:
        save_plot(result, path, budget_bytes)
    written = write_plans(result, save_plans) if save_plans else []
    if as_json:
        data = {"points": [p.to_json() for p in result.points], "budget_bytes": budget_bytes}
        print_json("sweep", {**data, "plans": [str(p) for p in written]})
        return
    out = console()
    show_sweep(result, out, budget_bytes)
    out.print(terminal_plot(result, budget_bytes), highlight=False, markup=False)
    for path in plots:
        out.print(f"plot written to {path}")
    if written:
        out.print(f"{len(written)} plans written to {save_plans}")
