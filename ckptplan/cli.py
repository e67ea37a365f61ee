"""The ``ckptplan`` command: a thin shell over the Python API.

Torch is imported inside the commands that need it, so ``ckptplan remat`` and ``ckptplan show``
start fast. A user error prints one line, ``error: ...``, and exits with status 2; any other
failure (a bug in ckptplan or torch) prints one line, ``internal error: ...``, and exits with
status 3. ``--debug`` (or ``CKPTPLAN_DEBUG=1``) adds the traceback.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from ckptplan import __version__
from ckptplan.boundary import (
    EXIT_INTERNAL_ERROR,
    Boundary,
    UserError,
    report_internal,
    user_errors,
)
from ckptplan.devices import DEVICES
from ckptplan.errors import DEBUG_ENV
from ckptplan.options import DTYPES, HUB_PREFIX, HUB_TASKS, OPTIMIZERS, SCOPES
from ckptplan.remat_command import remat
from ckptplan.solvers import SOLVERS


def writable_destination(path: str) -> None:
    """Refuse an output path before the long work, not after it."""
    folder = Path(path).resolve().parent
    if not folder.is_dir():
        raise UserError(f"-o {path}: the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise UserError(f"-o {path}: the folder {folder} is not writable")


def _console(stderr: bool = False) -> Console:
    """A console that wraps at the terminal's width, and not at all into a pipe or file (rich
    would wrap at 80 columns there, breaking a report's lines for grep)."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=10_000, soft_wrap=True)


def _print_json(command: str, data: dict[str, Any]) -> None:
    """A command's ``--json`` output, led by the schema it follows (``ckptplan.solve/1``)."""
    click.echo(json.dumps({"schema": f"ckptplan.{command}/1", **data}, indent=2))


@click.group(
    cls=Boundary,
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
    Exit status:
      0  success
      1  a check failed: verify measured a peak over budget or differing gradients
      2  bad input (the model file, the plan, an option), stated in one line
      3  internal error: a bug in ckptplan or torch (--debug for the traceback)
    """
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


def _optimizer_option(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A shortcut or a dotted class path (imported when the step is built)."""
    if value in OPTIMIZERS or ("." in value and all(p.isidentifier() for p in value.split("."))):
        return value
    raise click.BadParameter(
        f"{value!r} is neither {', '.join(OPTIMIZERS)} nor a class path like torch.optim.Adafactor"
    )


_model_options = [
    click.option(
        "--batch-size", type=click.IntRange(min=1), default=None, help="Override the batch size."
    ),
    click.option(
        "--optimizer",
        default="adamw",
        show_default=True,
        callback=_optimizer_option,
        help=f"Optimizer whose state the budget counts: {', '.join(OPTIMIZERS)}, or an "
        "optimizer class (torch.optim.Adafactor).",
    ),
    click.option(
        "--dtype",
        type=click.Choice(DTYPES),
        default="fp32",
        show_default=True,
        help="Parameter and activation dtype.",
    ),
    click.option(
        "--autocast",
        type=click.Choice(DTYPES[1:]),
        default=None,
        help="Run forward under torch.autocast in this dtype.",
    ),
    click.option(
        "--device",
        type=click.Choice(sorted(DEVICES)),
        default="cpu",
        show_default=True,
        help="Device whose roofline estimates op times.",
    ),
    click.option(
        "--blocks",
        default=None,
        help="Module paths of the chain's blocks, e.g. 'layers.*' (default: found).",
    ),
    click.option(
        "--measure",
        is_flag=True,
        help="Time every op in a real step on this machine instead of the roofline.",
    ),
]


_hub_options = [
    click.option(
        "--task",
        type=click.Choice(HUB_TASKS),
        default=None,
        help="For hf: models, the task to build (default: from the config's architectures).",
    ),
    click.option(
        "--seq-len",
        type=click.IntRange(min=1),
        default=None,
        help="For hf: text models, tokens per sequence [default: 512].",
    ),
    click.option(
        "--image-size",
        type=click.IntRange(min=1),
        default=None,
        help="For hf: image models, the image side [default: the config's].",
    ),
]


def hub_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--task``, ``--seq-len`` and ``--image-size``, folded into MODEL_FILE when it names a
    Hugging Face config (``hf:NAME_OR_DIR``); refused with a model file, which sets its own."""

    @functools.wraps(command)
    def wrapper(*args: Any, task: Any, seq_len: Any, image_size: Any, **kwargs: Any) -> Any:
        options = {"task": task, "seq_len": seq_len, "image_size": image_size}
        given = [f"--{k.replace('_', '-')}" for k, v in options.items() if v is not None]
        model = kwargs["model_file"]
        if model.startswith(HUB_PREFIX):
            from ckptplan.hub import HubModel

            kwargs["model_file"] = HubModel.parse(model, **options)
        elif given:
            raise UserError(f"{', '.join(given)} apply to hf: models; {model} sets its own inputs")
        return command(*args, **kwargs)

    for option in reversed(_hub_options):
        wrapper = option(wrapper)
    return wrapper


def model_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_model_options):
        command = option(command)
    return hub_options(command)


@cli.command()
@click.argument("model_file", type=click.Path(dir_okay=False))
@click.option(
    "--budget",
    required=True,
    help="Peak memory of a step: 12GB, 11.5GiB, 800MB, bytes, 0.6 or 60%.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the plan here (JSON).",
)
@click.option(
    "--solver",
    type=click.Choice(SOLVERS),
    default="auto",
    show_default=True,
    help="auto: segments and selective per-op policies; dp: segments only; or a fixed policy.",
)
@click.option(
    "--every", type=click.IntRange(min=1), default=2, show_default=True, help="k for every-k."
)
@click.option(
    "--max-segment",
    type=click.IntRange(min=1),
    default=None,
    help="Longest run of blocks one region may hold.",
)
@click.option(
    "--scope",
    type=click.Choice(SCOPES),
    default="step",
    show_default=True,
    help="Budget the whole step, or activations alone.",
)
@model_options
@click.option(
    "--margin",
    type=float,
    default=None,
    help="Percent of the budget the plan leaves unused [default: the device's: 0.1 on the "
    "cpu, 3 on a GPU, whose allocator rounds and fragments].",
)
@click.option(
    "--world-size",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Data-parallel ranks; with --fsdp or --ddp the budget and the plan are per rank.",
)
@click.option(
    "--fsdp",
    "parallel",
    flag_value="fsdp",
    default=None,
    help="FSDP2 (fully_shard each block, then the root): parameters, gradients and optimizer "
    "state sharded over the ranks.",
)
@click.option("--ddp", "parallel", flag_value="ddp", help="DDP: replicated, plus gradient buckets.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@user_errors
def solve(
    model_file: str,
    budget: str,
    output: str | None,
    solver: str,
    every: int,
    max_segment: int | None,
    scope: str,
    batch_size: int | None,
    optimizer: str,
    dtype: str,
    autocast: str | None,
    device: str,
    blocks: str | None,
    measure: bool,
    margin: float | None,
    world_size: int,
    parallel: str | None,
    as_json: bool,
) -> None:
    """Profile MODEL_FILE on fake tensors and find the plan that fits BUDGET."""
    from ckptplan.api import solve as solve_plan
    from ckptplan.report import show_plan

    if output:
        writable_destination(output)
    status = Console(stderr=True).status(f"profiling {model_file} on fake tensors and solving")
    with status:
        plan = solve_plan(
            model_file,
            budget=budget,
            solver=solver,
            scope=scope,
            every=every,
            max_segment=max_segment,
            batch_size=batch_size,
            optimizer=optimizer,
            dtype=dtype,
            autocast=autocast,
            device=device,
            blocks=blocks,
            measure=measure,
            world_size=world_size,
            parallel=parallel,
            margin=margin,
        )
    if output:
        plan.save(output)
    if as_json:
        _print_json(
            "solve",
            {
                "budget_bytes": plan.budget["bytes"],
                "predicted_peak_bytes": plan.predicted["peak_bytes"],
                "predicted_overhead": plan.predicted["overhead"],
                "solver": plan.solver,
                "regions": [list(r.modules) for r in plan.regions],
                "plan": plan.to_json(),
            },
        )
        return
    console = _console()
    show_plan(plan, console)
    if output:
        console.print(
            f"plan written to [bold]{output}[/]; in training: "
            f"model = ckptplan.apply(model, {output!r})"
        )


@cli.command("profile")
@click.argument("model_file", type=click.Path(dir_okay=False))
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
@model_options
@click.option("--json", "as_json", is_flag=True, help="Print the whole profile as JSON.")
@user_errors
def profile_command(
    model_file: str,
    depth: int,
    top: int,
    batch_size: int | None,
    optimizer: str,
    dtype: str,
    autocast: str | None,
    device: str,
    blocks: str | None,
    measure: bool,
    as_json: bool,
) -> None:
    """Profile MODEL_FILE on fake tensors: memory, FLOPs and time by module."""
    from ckptplan.api import profile
    from ckptplan.report import profile_json, show_profile

    console = _console(stderr=as_json)
    with console.status(f"tracing one training step of {model_file} on fake tensors"):
        result = profile(
            model_file,
            batch_size=batch_size,
            optimizer=optimizer,
            dtype=dtype,
            autocast=autocast,
            device=device,
            blocks=blocks,
            measure=measure,
        )
    if as_json:
        _print_json("profile", profile_json(result, depth))
    else:
        show_profile(result, console, depth, top)


@cli.command("sweep")
@click.argument("model_file", type=click.Path(dir_okay=False))
@click.option(
    "--points",
    type=click.IntRange(min=1),
    default=6,
    show_default=True,
    help="Points of the dp and auto frontiers.",
)
@click.option(
    "--verify",
    "run_verify",
    is_flag=True,
    help="Also run every point for real: measured peak and step time.",
)
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True)
@click.option(
    "--plot",
    "plots",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="Save the frontier as an image (.png or .svg); repeatable.",
)
@model_options
@click.option("--json", "as_json", is_flag=True, help="Print the points as JSON.")
@user_errors
def sweep_command(
    model_file: str,
    points: int,
    run_verify: bool,
    repeats: int,
    plots: tuple[str, ...],
    batch_size: int | None,
    optimizer: str,
    dtype: str,
    autocast: str | None,
    device: str,
    blocks: str | None,
    measure: bool,
    as_json: bool,
) -> None:
    """The memory/step-time frontier of every strategy: none, full, every-k, sqrt, dp, auto."""
    from ckptplan.api import load_workload
    from ckptplan.profiler import Settings
    from ckptplan.report import show_sweep
    from ckptplan.sweep import save_plot, sweep, terminal_plot

    workload = load_workload(model_file)
    settings = Settings(batch_size, optimizer, dtype, device, blocks, autocast, measure)
    console = _console(stderr=as_json)
    with console.status(f"solving every strategy for {model_file}"):
        results = sweep(workload, settings, points=points, verify=run_verify, repeats=repeats)
    for path in plots:
        save_plot(results, path, f"{workload.name}: memory against step time")
    if as_json:
        _print_json("sweep", {"points": [p.to_json() for p in results]})
        return
    show_sweep(results, console)
    console.print(terminal_plot(results), highlight=False, markup=False)
    for path in plots:
        console.print(f"plot written to {path}")


@cli.command()
@click.argument("model_file", type=click.Path(dir_okay=False))
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
    model_file: str,
    plan_file: str,
    output: str,
    weights: str | None,
    state_dict: str | None,
    force: bool,
) -> None:
    """Write MODEL_FILE's model with PLAN_FILE's checkpointing as a standalone module.

    The module is the model traced by torch.fx; each checkpointed region is a submodule its
    forward calls through torch.utils.checkpoint. Models that do not trace: ckptplan.apply.
    """
    from ckptplan.rewrite import rewrite_file

    module, source, weights_file = rewrite_file(
        model_file, plan_file, output, weights=weights, state_dict=state_dict, force=force
    )
    regions = ", ".join(r.name for r in module.ckptplan_regions)
    click.echo(f"wrote {source} (checkpointed: {regions}) and its weights {weights_file}")
    click.echo(f"in training: model = build_model() from {source}")


@cli.command()
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the plan file's JSON.")
@user_errors
def show(plan_file: str, as_json: bool) -> None:
    """Print a plan without loading its model."""
    from ckptplan.plan import Plan
    from ckptplan.report import show_plan

    plan = Plan.load(plan_file)
    if as_json:
        click.echo(json.dumps(plan.to_json(), indent=2))  # the plan's own schema
    else:
        show_plan(plan, _console())


@cli.command()
@click.argument("model_file", type=click.Path(dir_okay=False))
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option(
    "--on",
    "target",
    default=None,
    help="Local device to run on (cpu, cuda, cuda:1); default cuda if present.",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Timed steps per variant (interleaved; the median counts).",
)
@click.option(
    "--force", is_flag=True, help="Measure even if the plan is for another model or device."
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@hub_options
@user_errors
def verify(
    model_file: str, plan_file: str, target: str | None, repeats: int, force: bool, as_json: bool
) -> None:
    """Run a training step with and without the plan: peak, time and gradients.

    Exits with status 1 when the measured peak exceeds the budget or gradients differ.
    """
    from ckptplan.api import verify as verify_plan
    from ckptplan.report import show_verification

    result = verify_plan(model_file, plan_file, device=target, repeats=repeats, force=force)
    if as_json:
        _print_json("verify", result.to_json())
    else:
        show_verification(result, _console())
    if not (result.within_budget and result.grads_match):
        sys.exit(1)


@cli.command()
@click.argument("model_file", type=click.Path(dir_okay=False))
@click.option("--budget", required=True, help="As for solve, in scope activations.")
@click.option(
    "--time-limit",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Seconds for the ILP.",
)
@model_options
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@user_errors
def gap(
    model_file: str,
    budget: str,
    time_limit: float,
    batch_size: int | None,
    optimizer: str,
    dtype: str,
    autocast: str | None,
    device: str,
    blocks: str | None,
    measure: bool,
    as_json: bool,
) -> None:
    """How far auto's plan is from the exact optimum over the op graph (the ilp solver).

    The step's forward and backward ops become a rematerialisation problem (any op may be
    recomputed, any number of times); CP-SAT solves it at the peak of auto's plan written as
    such a schedule. For small models: a few hundred ops prove optimal in a minute.
    """
    from ckptplan.api import optimality_gap_of_auto
    from ckptplan.report import show_gap

    with Console(stderr=True).status(f"solving {model_file} with auto and with the exact ILP"):
        report = optimality_gap_of_auto(
            model_file,
            budget=budget,
            time_limit_s=time_limit,
            batch_size=batch_size,
            optimizer=optimizer,
            dtype=dtype,
            autocast=autocast,
            device=device,
            blocks=blocks,
            measure=measure,
        )
    if as_json:
        _print_json("gap", report.to_json())
    else:
        show_gap(report, _console())


cli.add_command(remat)


def main() -> None:
    try:
        cli()
    except Exception as exc:  # raised outside any command (click's own setup): still one line
        report_internal(exc)
        sys.exit(EXIT_INTERNAL_ERROR)
