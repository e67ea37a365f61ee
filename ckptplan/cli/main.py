"""The ``ckptplan`` command: a thin shell over the Python API.

Torch is imported inside the commands that need it, so ``ckptplan remat`` and ``ckptplan show``
start fast. A user error prints one line, ``error: ...``, and exits with status 2; any other
failure (a bug in ckptplan or torch) prints one line, ``internal error: ...``, and exits with
status 3. ``--debug`` (or ``CKPTPLAN_DEBUG=1``) adds the traceback. The options several
commands share are in ``ckptplan.cli.options``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ckptplan import __version__
from ckptplan.cli.boundary import (
    EXIT_INTERNAL_ERROR,
    UserError,
    report_internal,
    user_errors,
)
from ckptplan.cli.fit import fit_command
from ckptplan.cli.group import Commands
from ckptplan.cli.options import (
    MODEL_HELP,
    budget_option,
    hub_options,
    model_argument,
    parallel_options,
    pipeline_options,
    run_on_option,
    solve_options,
    step_options,
    tune_for_timing,
)
from ckptplan.cli.output import console, print_json, progress_display, writable_destination
from ckptplan.cli.remat import remat
from ckptplan.cli.sweep import sweep_command
from ckptplan.errors import DEBUG_ENV
from ckptplan.options import Parallel, ProfileOptions, SolveOptions
from ckptplan.values.pipeline_types import Pipeline, stage_lines
from ckptplan.values.plan import Plan


@click.group(
    cls=Commands,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option(
    "--debug",
    is_flag=True,
    help=f"On an error, print the traceback too (or set {DEBUG_ENV}=1).",
)
@click.version_option(__version__, prog_name="ckptplan")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Find the best activation-checkpointing plan for a PyTorch model, and apply it.

    \b
    MODEL is a model file (model.py), MODULE:FUNCTION (a factory in an importable module,
    beside its example_inputs), or hf:NAME_OR_DIR (a Hugging Face config).
    --target is the device a plan is for (cpu, h100, ...); --on where a command runs a step.

    \b
    Exit status:
      0  success
      1  a check failed: verify measured a peak over budget or differing gradients
      2  bad input (the model file, the plan, an option), stated in one line
      3  internal error: a bug in ckptplan or torch (--debug for the traceback)
    """
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


@cli.command(epilog=MODEL_HELP)
@model_argument
@budget_option()
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the plan here (JSON).",
)
@solve_options
@step_options
@parallel_options
@click.option(
    "--compile",
    "compiled",
    is_flag=True,
    help="Plan for ckptplan.apply, then torch.compile: the budget holds the partition "
    "inductor makes (found on fake tensors), and the plan keeps dropout exact.",
)
@pipeline_options
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@user_errors
def solve(
    model: str,
    budget: str,
    output: str | None,
    search: SolveOptions,
    step: ProfileOptions,
    ranks: Parallel,
    pipeline: Pipeline | None,
    as_json: bool,
) -> None:
    """Profile MODEL on fake tensors and find the plan that fits BUDGET."""
    from ckptplan.api import load_workload, solve_with
    from ckptplan.values.budget import parse_budget

    if step.measure:
        tune_for_timing()
    if output:
        writable_destination(output)
    if pipeline is not None:
        _solve_pipeline(model, budget, output, search, step, ranks, pipeline, as_json)
        return
    with progress_display(as_json) as progress:
        parsed = parse_budget(budget)
        plan = solve_with(load_workload(model), parsed, step, search, ranks, progress)
    summary = {
        "predicted_peak_bytes": plan.predicted.peak_bytes,
        "predicted_overhead": plan.predicted.overhead,
        "solver": plan.solver,
        "regions": [list(r.units) for r in plan.regions],
    }
    use = f"in training: model = ckptplan.apply(model, {output!r})"
    _deliver(plan, output, as_json, summary, [], use)


def _deliver(
    plan: Plan,
    output: str | None,
    as_json: bool,
    summary: dict[str, Any],
    lines: list[str],
    use: str,
) -> None:
    """A solved plan saved to ``output`` (if any), then printed as JSON (``summary`` beside the
    plan) or shown with ``lines`` after it and, once saved, how to ``use`` it."""
    from ckptplan.cli.report import show_plan

    if output:
        plan.save(output)
    if as_json:
        print_json("solve", {"budget_bytes": plan.budget.bytes, **summary, "plan": plan.to_json()})
        return
    out = console()
    show_plan(plan, out)
    for line in lines:
        out.print(line, markup=False, highlight=False)
    if output:
        out.print(f"plan written to [bold]{output}[/]; {use}")


def _solve_pipeline(
    model: str,
    budget: str,
    output: str | None,
    search: SolveOptions,
    step: ProfileOptions,
    ranks: Parallel,
    pipeline: Pipeline,
    as_json: bool,
) -> None:
    """``solve --pipeline-stages``: one plan with a section per stage
    (``ckptplan.planning.pipeline``)."""
    from ckptplan.api import load_workload
    from ckptplan.planning.pipeline import solve_pipeline_with
    from ckptplan.values.budget import parse_budget

    if search.scope != "step" or step.compiled:
        raise UserError(
            "--pipeline-stages plans the whole step in eager mode: leave out "
            "--scope activations and --compile"
        )
    if step.batch_size is None:
        raise UserError(
            "--pipeline-stages needs --batch-size, the step's batch per "
            "data-parallel rank (a multiple of --microbatches)"
        )
    with progress_display(as_json) as progress:
        parsed = parse_budget(budget)
        plan = solve_pipeline_with(
            load_workload(model), parsed, pipeline, step, search, ranks, progress
        )
    use = (
        "in stage i's training script: "
        f"stage_module = ckptplan.apply(stage_module, {output!r}, stage=i)"
    )
    summary = {"stages": [s.to_json() for s in plan.stages]}
    _deliver(plan, output, as_json, summary, stage_lines(plan), use)


@cli.command("profile", epilog=MODEL_HELP)
@model_argument
@click.option(
    "--depth",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    help="Module depth of the per-module table.",
)
@click.option(
    "--top",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="How many of the largest saved tensors to list.",
)
@step_options
@click.option("--json", "as_json", is_flag=True, help="Print the whole profile as JSON.")
@user_errors
def profile_command(model: str, depth: int, top: int, step: ProfileOptions, as_json: bool) -> None:
    """Profile MODEL on fake tensors: memory, FLOPs and time by module."""
    from ckptplan.api import load_workload, profile_with
    from ckptplan.cli.profile_report import profile_json, show_profile

    if step.measure:
        tune_for_timing()

    with progress_display(as_json) as progress:
        result = profile_with(load_workload(model), step, Parallel(), progress)
    if as_json:
        print_json("profile", profile_json(result, depth))
    else:
        show_profile(result, console(), depth, top)


@cli.command(epilog="MODEL: a model file (model.py), MODULE:FUNCTION or hf:NAME_OR_DIR.")
@model_argument
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    required=True,
    help="Write the checkpointed module here (.py); its weights go beside it (.pt).",
)
@click.option(
    "--weights", type=click.Path(dir_okay=False), default=None, help="Write the weights here."
)
@click.option(
    "--state-dict",
    type=click.Path(dir_okay=False),
    default=None,
    help="Load these weights into the model first (default: build_model()'s).",
)
@click.option("--force", is_flag=True, help="Rewrite even if the model's fingerprint differs.")
@user_errors
def rewrite(
    model: str,
    plan_file: str,
    output: str,
    weights: str | None,
    state_dict: str | None,
    force: bool,
) -> None:
    """Write MODEL's model with PLAN_FILE's checkpointing as a standalone module.

    The module is the model traced by torch.fx; each checkpointed region is a submodule its
    forward calls through torch.utils.checkpoint. Models that do not trace: ckptplan.apply.
    """
    from ckptplan.rewriting.graph import rewrite_file

    writable_destination(output, "-o")
    if weights is not None:
        writable_destination(weights, "--weights")
    module, source, weights_file = rewrite_file(
        model, plan_file, output, weights=weights, state_dict=state_dict, force=force
    )
    regions = ", ".join(r.name for r in module.ckptplan_regions)
    click.echo(f"wrote {source} (checkpointed: {regions}) and its weights {weights_file}")
    click.echo(f"in training: model = build_model() from {source}")


@cli.command()
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the plan file's JSON.")
@user_errors
def show(plan_file: str, as_json: bool) -> None:
    """Print a plan, the settings it assumed and its prediction, without loading its model."""
    from ckptplan.cli.report import show_plan
    from ckptplan.values.plan import Plan

    plan = Plan.load(plan_file)
    if as_json:
        click.echo(json.dumps(plan.to_json(), indent=2))  # the plan's own schema
    else:
        out = console()
        show_plan(plan, out)
        for line in stage_lines(plan):
            out.print(line, markup=False, highlight=False)


@cli.command(epilog=MODEL_HELP)
@model_argument
@click.argument("plan_file", type=click.Path(dir_okay=False))
@run_on_option("Local device to run on (cpu, cuda, cuda:1); default cuda if present.")
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Timed steps per variant (interleaved; the median counts).",
)
@click.option(
    "--force", is_flag=True, help="Measure even if the plan is for another model or target."
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@hub_options
@user_errors
def verify(
    model: str, plan_file: str, run_on: str | None, repeats: int, force: bool, as_json: bool
) -> None:
    """Run a training step with and without the plan: peak, time and gradients.

    Exits with status 1 when the measured peak exceeds the budget, gradients differ, or a
    compiled plan's step compiles into more graphs or graph breaks than the unchecked step.
    """
    from ckptplan.api import verify as verify_plan
    from ckptplan.cli.report import show_verification

    tune_for_timing()
    with progress_display(as_json) as progress:
        result = verify_plan(
            model, plan_file, run_on=run_on, repeats=repeats, force=force, progress=progress
        )
    if as_json:
        print_json("verify", result.to_json())
    else:
        show_verification(result, console())
    compiled = result.compiled
    if not result.graphs_match and compiled is not None:
        click.echo(
            f"verify: the plan adds graph breaks: its compiled step made {compiled.graphs} "
            f"graphs and {compiled.graph_breaks} breaks, the unchecked step "
            f"{compiled.unchecked_graphs} and {compiled.unchecked_graph_breaks}",
            err=True,
        )
    if not (result.within_budget and result.grads_match and result.graphs_match):
        sys.exit(1)


@cli.command(epilog=MODEL_HELP)
@model_argument
@budget_option("As for solve, in scope activations.")
@click.option(
    "--time-limit",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Seconds for the ILP.",
)
@step_options
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@user_errors
def gap(model: str, budget: str, time_limit: float, step: ProfileOptions, as_json: bool) -> None:
    """How far auto's plan is from the exact optimum over the op graph (the ilp solver).

    The step's forward and backward ops become a rematerialisation problem (any op may be
    recomputed, any number of times); CP-SAT solves it at the peak of auto's plan written as
    such a schedule. For small models: a few hundred ops prove optimal in a minute.
    """
    from ckptplan.api import load_workload, optimality_gap_with
    from ckptplan.cli.report import show_gap
    from ckptplan.values.budget import parse_budget

    with progress_display(as_json) as progress:
        progress.phase("solving with auto and with the exact ILP")
        parsed = parse_budget(budget)
        report = optimality_gap_with(load_workload(model), parsed, step, time_limit)
    if as_json:
        print_json("gap", report.to_json())
    else:
        show_gap(report, console())


cli.add_command(fit_command)
cli.add_command(remat)
cli.add_command(sweep_command)


def main() -> None:
    try:
        cli()
    except Exception as exc:  # raised outside any command (click's own setup): still one line
        report_internal(exc)
        sys.exit(EXIT_INTERNAL_ERROR)
