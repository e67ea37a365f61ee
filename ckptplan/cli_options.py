"""Options and output helpers the ``ckptplan`` commands share.

Two words for two devices, the same in every command and in the Python API: ``--target``
(``target=``) is the device a plan is *for*, whose roofline prices the ops and whose allocator
the budget is held against (cpu, h100, ...); ``--on`` (``run_on=``) is the local device a command
*runs* a real step on (cpu, cuda, cuda:1). ``--device``, the old spelling of ``--target``, still
works, hidden, and says so.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from ckptplan.boundary import UserError
from ckptplan.devices import DEVICES
from ckptplan.options import (
    DTYPES,
    HUB_PREFIX,
    HUB_TASKS,
    OPTIMIZERS,
    is_factory_spec,
    precision,
)
from ckptplan.progress import QUIET, Progress

if TYPE_CHECKING:
    from ckptplan.profiler import Settings

MODEL_HELP = "MODEL: a model file (model.py), MODULE:FUNCTION, or hf:NAME_OR_DIR."


def model_argument(command: Callable[..., Any]) -> Callable[..., Any]:
    """MODEL: a model file, ``MODULE:NAME`` or ``hf:NAME_OR_DIR`` (resolved by the API)."""
    return click.argument("model", metavar="MODEL")(command)


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


def progress_display(as_json: bool) -> AbstractContextManager[Progress]:
    """A spinner where a person watches (stdout and stderr both terminals, no ``--json``);
    elsewhere nothing, so that pipes, files and JSON get the report alone."""
    if as_json or not (sys.stdout.isatty() and sys.stderr.isatty()):
        return nullcontext(QUIET)
    return Spinner(Console(stderr=True))


@dataclass(frozen=True)
class StepOptions:
    """The training step a command profiles, as its flags give it; the fields are the Python
    API's keywords (``ckptplan.solve(model, **step.keywords(), ...)``)."""

    batch_size: int | None = None
    optimizer: str = "adamw"
    dtype: str = "fp32"
    autocast: str | None = None
    target: str = "cpu"
    blocks: str | None = None
    measure: bool = False

    def keywords(self) -> dict[str, Any]:
        return asdict(self)

    def settings(self) -> Settings:
        """The profiler's settings (which call the target ``device``)."""
        from ckptplan.profiler import Settings

        keywords = self.keywords()
        return Settings(device=keywords.pop("target"), **keywords)


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
        if model.startswith(HUB_PREFIX):
            from ckptplan.hub import HubModel

            kwargs["model"] = HubModel.parse(model, **options)
        elif given:
            raise UserError(f"{', '.join(given)} apply to hf: models; {model} sets its own inputs")
        return command(*args, **kwargs)

    return _apply(_HUB_OPTIONS, wrapper)


def step_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The flags of the profiled step, handed to the command as one ``step: StepOptions``."""

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        batch_size: int | None,
        optimizer: str,
        dtype: str,
        autocast: str | None,
        target: str | None,
        old_target: str | None,
        blocks: str | None,
        measure: bool,
        **kwargs: Any,
    ) -> Any:
        if old_target is not None:
            if target is not None and target != old_target:
                raise UserError(f"--device {old_target} and --target {target}: give --target alone")
            click.echo(
                "note: --device is now --target (the device the plan is for; --on is where "
                "a command runs); --device will be removed",
                err=True,
            )
        try:
            dtype, autocast = precision(dtype, autocast)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        step = StepOptions(
            batch_size, optimizer, dtype, autocast, target or old_target or "cpu", blocks, measure
        )
        return command(*args, step=step, **kwargs)

    return hub_options(_apply(_STEP_OPTIONS, wrapper))


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
        from ckptplan.pipeline_types import Pipeline

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
    from ckptplan.memtrack import keep_freed_host_memory

    keep_freed_host_memory()
