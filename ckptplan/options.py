"""The options of each stage as one typed object per concern, the names of the choices the
CLI and the API offer; no torch.

Note [one field per option]: a flag of the CLI, a keyword of the Python API and a field of
an options object share one name. ``ProfileOptions`` says which training step is profiled
and for which device, ``SolveOptions`` how the plan is searched (its ``solver_options`` tune
the chain solvers), ``Parallel`` the data-parallel ranks the budget is one of. The CLI folds
its flags into them by name (``fold_keywords``); the API's functions take each field as an
explicit keyword-only parameter (so ``help()`` and ``inspect.signature`` show them) and
make the objects with ``options_from``. A new option is a field, the code that reads it, a
flag and a parameter of each function that takes its concern: ``tests/test_options.py``
checks that every one of them names every field.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, get_args

from ckptplan.errors import option
from ckptplan.solvers import SolverName, SolverOptions

Optimizer = Literal["adamw", "adam", "sgd", "none"]
"""The optimizer shortcuts; an optimizer class's dotted path (``torch.optim.Adafactor``) too."""
OPTIMIZERS: tuple[Optimizer, ...] = get_args(Optimizer)
DType = Literal["fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed"]
MIXED_PRECISION = {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}
"""Mixed precision as accelerate's ``--mixed_precision`` runs it: fp32 master weights,
gradients and optimizer state, forward under ``torch.autocast`` in the half dtype."""
DTYPES: tuple[DType, ...] = get_args(DType)
Autocast = Literal["bf16", "fp16"]
Scope = Literal["step", "activations"]
"""What a budget holds: the whole step's peak, or the activations alone."""
SCOPES: tuple[Scope, ...] = get_args(Scope)
Target = Literal["cpu", "h100", "h200", "b200", "a100", "l4", "rtx4090"]
"""The devices a plan can be for (``ckptplan.devices``, which a test keeps in step)."""
Strategy = Literal["fsdp", "ddp"]


@dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    """The training step that is profiled, and the device it is priced for. The API also
    takes a ``torch.dtype`` for ``dtype``/``autocast`` and an optimizer class for
    ``optimizer``: a plan records their names."""

    batch_size: int | None = None
    optimizer: Optimizer | str = "adamw"
    dtype: DType = "fp32"
    autocast: Autocast | None = None
    target: Target = "cpu"
    blocks: str | None = None
    """Module paths of the chain's blocks (``layers.*``); None: found."""
    measure: bool = False
    """Time every op in a real step on this machine instead of the target's roofline."""
    compiled: bool = False
    """The step runs under ``torch.compile``: priced fused, its peak the partition's."""


@dataclass(frozen=True, kw_only=True)
class SolveOptions:
    """How the plan is searched for."""

    solver: SolverName = "auto"
    scope: Scope = "step"
    margin: float | None = None
    """Percent of the budget held back, left unused; None: the target's (0.1 on the CPU, 3 on
    a GPU; ``ckptplan.devices.held_back_percent``)."""
    fake_run: bool = True
    """Run the chosen plan on fake tensors and solve again if it needs more than predicted."""
    offload: bool = True
    """Let selective policies move saved tensors to host memory where that is cheaper than
    recomputing them (Note [when offload pays] in ``ckptplan.devices``); False: never."""
    solver_options: SolverOptions = field(default_factory=SolverOptions)


@dataclass(frozen=True, kw_only=True)
class Parallel:
    """The data-parallel ranks a budget is one of: with a strategy, the budget, the profile
    and the plan are one rank's (``batch_size`` is then the per-rank batch)."""

    world_size: int = 1
    strategy: Strategy | None = None


C = TypeVar("C")


def options_from(values: Mapping[str, Any]) -> tuple[ProfileOptions, SolveOptions, Parallel]:
    """The options objects a call's keyword-only parameters (``locals()``) fill: each field
    from the value of its name, the default where the call has no parameter of that name.

    >>> step, search, ranks = options_from({"target": "h100", "every": 3, "budget": "60%"})
    >>> step.target, search.solver_options.every, ranks.world_size
    ('h100', 3, 1)
    """
    return _filled(ProfileOptions, values), _filled(SolveOptions, values), _filled(Parallel, values)


def _filled(kind: type[C], values: Mapping[str, Any]) -> C:
    changes: dict[str, Any] = {}
    for entry in dataclasses.fields(cast(Any, kind)):
        if entry.name in values:
            changes[entry.name] = values[entry.name]
        elif entry.name == "solver_options":
            changes[entry.name] = _filled(SolverOptions, values)
    return kind(**changes)


def fold_keywords(config: C, keywords: dict[str, Any]) -> C:
    """``config`` with each keyword that names one of its fields, or a field of an options
    object inside it, taken out of ``keywords`` and set (Note [one field per option]).

    >>> keywords = {"solver": "dp", "max_segment": 4, "budget": "60%"}
    >>> options = fold_keywords(SolveOptions(), keywords)
    >>> options.solver, options.solver_options.max_segment, keywords
    ('dp', 4, {'budget': '60%'})
    """
    changes: dict[str, Any] = {}
    for entry in dataclasses.fields(cast(Any, config)):
        value = getattr(config, entry.name)
        if entry.name in keywords:
            changes[entry.name] = keywords.pop(entry.name)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes[entry.name] = fold_keywords(value, keywords)
    return cast(C, dataclasses.replace(cast(Any, config), **changes))


_FACTORY = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def is_factory_spec(spec: object) -> bool:
    """Whether ``spec`` is ``MODULE:NAME`` (``mypkg.models:build_gpt``) and no file of that name."""
    return isinstance(spec, str) and bool(_FACTORY.match(spec)) and not Path(spec).exists()


def precision(dtype: str, autocast: str | None) -> tuple[str, str | None]:
    """The parameter dtype and the autocast dtype a ``--dtype`` and ``--autocast`` stand for:
    ``bf16-mixed`` is fp32 under autocast bf16 (a plan records the pair). ValueError when they
    disagree.

    >>> precision("bf16-mixed", None), precision("bf16", None)
    (('fp32', 'bf16'), ('bf16', None))
    """
    half = MIXED_PRECISION.get(dtype)
    if half is None:
        return dtype, autocast
    if autocast not in (None, half):
        raise ValueError(
            f"{option('dtype', dtype)} runs forward under autocast {half}, not {autocast}; "
            f"give {option('dtype', 'fp32')} {option('autocast', autocast)} for that"
        )
    return "fp32", half
