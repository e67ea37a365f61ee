"""Options and output helpers the ``ckptplan`` commands share.

Two words for two devices, the same in every command and in the Python API: ``--target``
(``target=``) is the device a plan is *for*, whose roofline prices the ops and whose allocator
the budget is held against (cpu, h100, ...); ``--on`` (``run_on=``) is the local device a command
*runs* a real step on (cpu, cuda, cuda:1). ``--device``, the old spelling of ``--target``, still
works, hidden, and says so.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from ckptplan.cli.boundary import UserError
from ckptplan.devices import DEVICES
from ckptplan.errors import CkptplanError
from ckptplan.huggingface import HUB_TASKS, is_hub_name
from ckptplan.options import (
    DTYPES,
    OPTIMIZERS,
    SCOPES,
    Parallel,
    ProfileOptions,
    SolveOptions,
    fold_keywords,
    is_factory_spec,
    precision,
)
from ckptplan.solvers import SOLVERS
from ckptplan.values.budget import parse_budget

MODEL_HELP = "MODEL: a model file (model.py), MODULE:FUNCTION, or hf:NAME_OR_DIR."


def model_argument(command: Callable[..., Any]) -> Callable[..., Any]:
    """MODEL: a model file, ``MODULE:NAME`` or ``hf:NAME_OR_DIR`` (resolved by the API)."""
    return click.argument("model", metavar="MODEL")(command)


BUDGET_HELP = (
    "Peak memory of a step: 12GB or 12G (10^9 bytes), 11.5GiB or 11.5Gi (2^30), 800MB, 0.6 "
    "or 60% (of the unchecked step). Bits (12Gb) are refused, and so is a bare number of "
    "bytes from 2 to 1000 (a unit left out)."
)


def _check_budget(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Parse ``--budget`` as the command line is read, so that a slip (``--budget 60``) is
    refused in a moment, before torch loads and the model is profiled."""
    if value is not None:
        try:
            parse_budget(value)
        except CkptplanError as exc:
            raise UserError(str(exc)) from None
    return value


def budget_option(
    help_text: str = BUDGET_HELP, required: bool = True
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--budget``, checked when parsed; the command receives the text as written."""
    return click.option("--budget", required=required, callback=_check_budget, help=help_text)


def _optimizer_option(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A shortcut or a dotted class path (imported when the step is built)."""
    if value in OPTIMIZERS or ("." in value and all(p.isidentifier() for p in value.split("."))):
        return value
    raise click.BadParameter(
        f"{value!r} is neither {', '.join(OPTIMIZERS)} nor a class path like torch.optim.Adafactor"
    )


_STEP_OPTIONS = [
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
        help="Parameter and activation dtype; bf16-mixed/fp16-mixed: fp32 weights, gradients "
        "and optimizer state, forward under autocast (accelerate's --mixed_precision).",
    ),
    click.option(
        "--autocast",
        type=click.Choice(("bf16", "fp16")),
        default=None,
        help="Run forward under torch.autocast in this dtype.",
    ),
    click.option(
        "--target",
        type=click.Choice(sorted(DEVICES)),
        default=None,
        help="Device the plan is for: its roofline prices ops, its allocator holds the "
        "budget [default: cpu].",
    ),
    click.option("--device", "old_target", type=click.Choice(sorted(DEVICES)), hidden=True),
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

_HUB_OPTIONS = [
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


def _apply(options: list[Callable[..., Any]], command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(options):
        command = option(command)
    return command


def hub_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--task``, ``--seq-len`` and ``--image-size``, folded into MODEL when it names a
    Hugging Face config (``hf:NAME_OR_DIR``); refused with a model file, which sets its own."""

    @functools.wraps(command)
    def wrapper(*args: Any, task: Any, seq_len: Any, image_size: Any, **kwargs: Any) -> Any:
        options = {"task": task, "seq_len": seq_len, "image_size": image_size}
        given = [f"--{k.replace('_', '-')}" for k, v in options.items() if v is not None]
        model = kwargs["model"]
        if is_factory_spec(model) and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # MODULE:FUNCTION imports as from `python -m`
        if is_hub_name(model):
            from ckptplan.hub import HubModel

            kwargs["model"] = HubModel.parse(model, **options)
        elif given:
            raise UserError(f"{', '.join(given)} apply to hf: models; {model} sets its own inputs")
        return command(*args, **kwargs)

    return _apply(_HUB_OPTIONS, wrapper)


def step_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The flags of the profiled step, folded by name into one ``step: ProfileOptions`` (with
    ``--compile``'s ``compiled`` where a command has it)."""

    @functools.wraps(command)
    def wrapper(*args: Any, old_target: str | None, **kwargs: Any) -> Any:
        if old_target is not None:
            if kwargs["target"] not in (None, old_target):
                raise UserError(
                    f"--device {old_target} and --target {kwargs['target']}: give --target alone"
                )
            click.echo(
                "note: --device is now --target (the device the plan is for; --on is where "
                "a command runs); --device will be removed",
                err=True,
            )
        kwargs["target"] = kwargs["target"] or old_target or "cpu"
        try:
            kwargs["dtype"], kwargs["autocast"] = precision(kwargs["dtype"], kwargs["autocast"])
        except ValueError as exc:
            raise UserError(str(exc)) from None
        step = fold_keywords(ProfileOptions(), kwargs)
        return command(*args, step=step, **kwargs)

    return hub_options(_apply(_STEP_OPTIONS, wrapper))


_SOLVE_OPTIONS = [
    click.option(
        "--solver",
        type=click.Choice(SOLVERS),
        default="auto",
        show_default=True,
        help="auto: segments and selective per-op policies; dp: segments only; or a fixed policy.",
    ),
    click.option(
        "--every", type=click.IntRange(min=1), default=2, show_default=True, help="k for every-k."
    ),
    click.option(
        "--max-segment",
        type=click.IntRange(min=1),
        default=None,
        help="Longest run of blocks one region may hold.",
    ),
    click.option(
        "--scope",
        type=click.Choice(SCOPES),
        default="step",
        show_default=True,
        help="Budget the whole step, or activations alone.",
    ),
    click.option(
        "--margin",
        type=float,
        default=None,
        help="Percent of the budget the plan holds back, unused [default: the target's: 0.1 "
        "on the cpu, 3 on a GPU, whose allocator rounds and fragments].",
    ),
    click.option(
        "--offload/--no-offload",
        default=True,
        show_default=True,
        help="Let selective policies move saved tensors to pinned host memory where the copy "
        "costs less than recomputing them (never for small tensors, whose copy's fixed cost "
        "outweighs it); --no-offload: never.",
    ),
]
"""The search's flags, each named as its field of ``SolveOptions`` or of the solvers'
``SolverOptions`` (Note [one field per option] in ``ckptplan.options``)."""


def solve_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The search's flags, folded by name into one ``search: SolveOptions``."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return command(*args, search=fold_keywords(SolveOptions(), kwargs), **kwargs)

    return _apply(_SOLVE_OPTIONS, wrapper)


_PARALLEL_OPTIONS = [
    click.option(
        "--world-size",
        type=click.IntRange(min=1),
        default=1,
        show_default=True,
        help="Data-parallel ranks; with --fsdp or --ddp the budget and the plan are per rank.",
    ),
    click.option(
        "--fsdp",
        "strategy",
        flag_value="fsdp",
        default=None,
        help="FSDP2 (fully_shard each block, then the root): parameters, gradients and "
        "optimizer state sharded over the ranks.",
    ),
    click.option(
        "--ddp", "strategy", flag_value="ddp", help="DDP: replicated, plus gradient buckets."
    ),
]


def parallel_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--world-size`` with ``--fsdp`` or ``--ddp``, as one ``ranks: Parallel``."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return command(*args, ranks=fold_keywords(Parallel(), kwargs), **kwargs)

    return _apply(_PARALLEL_OPTIONS, wrapper)


def run_on_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--on``: the local device a real step runs on."""
    return click.option("--on", "run_on", default=None, help=help_text)


_PIPELINE_OPTIONS = [
    click.option(
        "--pipeline-stages",
        type=int,
        default=None,
        help="Pipeline-parallel stages (ranks): one budget and one plan per stage.",
    ),
    click.option(
        "--microbatches", type=int, default=None, help="Microbatches per step of the pipeline."
    ),
    click.option(
        "--schedule",
        type=click.Choice(("gpipe", "1f1b", "interleaved-1f1b")),
        default=None,
        help="Pipeline schedule: how many microbatches each stage keeps in flight.",
    ),
    click.option(
        "--stages-per-rank",
        type=int,
        default=None,
        help="Virtual stages per rank of interleaved-1f1b [default: 2].",
    ),
    click.option(
        "--stage-split",
        default=None,
        help="Blocks per stage, e.g. 3,3 (default: balanced by forward time).",
    ),
]


def pipeline_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The pipeline's flags, handed to the command as one ``pipeline: Pipeline | None``."""

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        pipeline_stages: int | None,
        microbatches: int | None,
        schedule: str | None,
        stages_per_rank: int | None,
        stage_split: str | None,
        **kwargs: Any,
    ) -> Any:
        from ckptplan.values.pipeline_types import Pipeline

        given = {"--microbatches": microbatches, "--schedule": schedule}
        given |= {"--stages-per-rank": stages_per_rank, "--stage-split": stage_split}
        if pipeline_stages is None:
            named = [flag for flag, value in given.items() if value is not None]
            if named:
                raise UserError(f"{named[0]} is for a pipeline; give --pipeline-stages P too")
            return command(*args, pipeline=None, **kwargs)
        if microbatches is None or schedule is None:
            raise UserError(
                "--pipeline-stages needs --microbatches M and --schedule gpipe|1f1b|"
                "interleaved-1f1b"
            )
        split = None
        if stage_split is not None:
            try:
                split = tuple(int(n) for n in stage_split.split(","))
            except ValueError:
                raise UserError(
                    f"--stage-split {stage_split}: give block counts separated by commas, e.g. 3,3"
                ) from None
        interleaved = schedule == "interleaved-1f1b"
        pipeline = Pipeline(
            stages=pipeline_stages,
            microbatches=microbatches,
            schedule=schedule,  # type: ignore[arg-type]  # click's choice
            stages_per_rank=stages_per_rank or (2 if interleaved else 1),
            split=split,
        )
        return command(*args, pipeline=pipeline, **kwargs)

    return _apply(_PIPELINE_OPTIONS, wrapper)


def tune_for_timing() -> None:
    """glibc's malloc set to keep freed memory, for a command that times steps on the CPU: a
    process-wide setting the library never makes for its callers (``ckptplan.callerstate``),
    harmless in the CLI's own process."""
    from ckptplan.profiling.memtrack import keep_freed_host_memory

    keep_freed_host_memory()
