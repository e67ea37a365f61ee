"""The plan ``ckptplan.autoplan(model, batch, budget="20GB")`` solves, kept on disk.

Solving takes seconds to minutes and a training job restarts often, so the plan is kept on disk
under a name made of everything that decides it: the model's fingerprint and which of its
parameters train, the shapes and dtypes of the example batch, the loss function's name, the
budget, every solve setting (dtype, optimizer, solver, ...) and the versions of ckptplan
and torch. A restart with the same settings reads the plan back; any change solves again, under
another name. The cached file is an ordinary plan (``ckptplan show`` reads it).

Solving runs on copies of the model (fake tensors), seeds torch's generators for its own steps
and restores them after, so the caller's random stream, modes and weights are as they were.

Only ``autoplan`` imports this module (and through it the planner); applying a solved plan
does not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ckptplan import __version__, api
from ckptplan.applying.install import refuse_unapplicable
from ckptplan.errors import CkptplanError
from ckptplan.fingerprint import inputs_signature, model_fingerprint
from ckptplan.loading import Inputs, as_inputs
from ckptplan.options import Parallel, ProfileOptions, SolveOptions
from ckptplan.profiling.training import dtype_name
from ckptplan.progress import Progress
from ckptplan.values.budget import Budget, parse_budget
from ckptplan.values.plan import Plan

log = logging.getLogger("ckptplan")

CACHE_ENV = "CKPTPLAN_CACHE"
"""The environment variable naming the plan cache folder (default ``~/.cache/ckptplan``)."""


def cached_plan(
    model: torch.nn.Module,
    budget: str | int | float,
    example_inputs: Inputs | torch.Tensor | None,
    step: ProfileOptions,
    search: SolveOptions,
    ranks: Parallel,
    loss_fn: Callable[[Any], torch.Tensor] | None,
    cache_dir: str | Path | None,
    progress: Progress,
) -> Plan:
    """The plan ``ckptplan.solve`` finds for ``model`` under these settings: read from the
    cache when it holds one, else solved (leaving the caller's state alone) and written there.
    """
    inputs = _inputs(example_inputs)
    parsed = _parsed(budget)
    refuse_unapplicable(model)
    settings = {"solve": search, "profile": step, "parallel": ranks}
    name = f"{type(model).__name__}-{_key(model, inputs, loss_fn, parsed, settings)}.json"
    path = _cache_folder(cache_dir) / name
    if path.is_file():
        try:
            plan = Plan.load(path)
        except CkptplanError as exc:
            log.warning("ckptplan: the cached plan is unreadable (%s); solving again", exc)
        else:
            log.info("ckptplan: plan read from the cache, %s", path)
            return plan
    with _caller_state_kept():
        workload = api.workload_of(model, inputs, loss_fn)
        plan = api.solve_with(workload, parsed, step, search, ranks, progress)
    _write(plan, path)
    return plan


def default_cache_dir() -> Path:
    """``$CKPTPLAN_CACHE``, else ``ckptplan`` in ``$XDG_CACHE_HOME`` (``~/.cache``)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "ckptplan"


def _inputs(example_inputs: Inputs | torch.Tensor | None) -> Inputs:
    if example_inputs is None:
        raise CkptplanError(
            "ckptplan.autoplan needs example_inputs, the args (a tuple) or kwargs "
            "(a dict) of forward for one training batch, to profile the step it solves for"
        )
    return as_inputs(example_inputs, "example_inputs= is of type")


def _parsed(budget: str | int | float) -> Budget:
    """The budget, refused before solving where ``ckptplan.solve`` would not take it."""
    if isinstance(budget, bool) or not isinstance(budget, str | int | float):
        raise CkptplanError(
            f"budget={budget!r}: pass a string such as '12GB', '800MiB' or '60%', or bytes"
        )
    try:
        return parse_budget(str(budget))
    except CkptplanError as exc:
        raise CkptplanError(f"budget={budget!r}: {exc}") from None


def _key(
    model: torch.nn.Module,
    inputs: Inputs,
    loss_fn: Callable[[Any], torch.Tensor] | None,
    parsed: Budget,
    settings: dict[str, Any],
) -> str:
    """The cache name of a plan: a digest of everything that decides it, every solve setting
    (each options object whole, so that naming a default is the same plan)."""
    described = {
        "model": model_fingerprint(model)["hash"],
        "frozen": [name for name, p in model.named_parameters() if not p.requires_grad],
        "inputs": inputs_signature(inputs),
        "loss_fn": None if loss_fn is None else _name_of(loss_fn),
        "budget": [parsed.bytes, parsed.fraction],
        "settings": {name: _settled(dataclasses.asdict(o)) for name, o in settings.items()},
        "versions": [__version__, torch.__version__],
    }
    text = json.dumps(described, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _settled(value: Any) -> Any:
    """A setting as the plan reads it: torch's dtypes by their names, classes by their paths."""
    if isinstance(value, dict):
        return {name: _settled(entry) for name, entry in value.items()}
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, type):
        return _name_of(value)
    return value


def _name_of(function: Callable[..., Any]) -> str:
    return f"{getattr(function, '__module__', '')}.{getattr(function, '__qualname__', function)}"


def _cache_folder(cache_dir: str | Path | None) -> Path:
    """The cache folder, made now: a folder that cannot be made is refused before solving."""
    folder = default_cache_dir() if cache_dir is None else Path(cache_dir).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CkptplanError(
            f"cache_dir={str(folder)!r} cannot be made ({exc.strerror}); pass a writable folder "
            f"as cache_dir= or in ${CACHE_ENV}"
        ) from None
    return folder


def _write(plan: Plan, path: Path) -> None:
    """Write the plan whole or not at all: ranks that solve at once each replace the file."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.part")
    try:
        plan.save(partial)
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        log.warning("ckptplan: the plan was not cached (%s); the next run solves again", exc)
        return
    log.info("ckptplan: solved a plan (%s) and cached it, %s", plan.solver, path)


@contextmanager
def _caller_state_kept() -> Iterator[None]:
    """Torch's random generators (the CPU's and every CUDA device's) as the caller left them:
    profiling seeds them for its own steps."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        yield
