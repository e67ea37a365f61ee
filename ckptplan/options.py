"""Names of the choices the CLI and the API offer, and their old spellings; no torch."""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from ckptplan.errors import option

F = TypeVar("F", bound=Callable[..., Any])

OPTIMIZERS = ("adamw", "adam", "sgd", "none")
MIXED_PRECISION = {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}
"""Mixed precision as accelerate's ``--mixed_precision`` runs it: fp32 master weights,
gradients and optimizer state, forward under ``torch.autocast`` in the half dtype."""
DTYPES = ("fp32", "bf16", "fp16", *MIXED_PRECISION)
SCOPES = ("step", "activations")
HUB_PREFIX = "hf:"
_FACTORY = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
HUB_TASKS = (
    "causal-lm",
    "masked-lm",
    "seq2seq-lm",
    "sequence-classification",
    "image-classification",
)


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


def renamed_keywords(**renames: str) -> Callable[[F], F]:
    """Old keyword spellings a function still takes, with a DeprecationWarning: ``device=``
    was both the target of ``solve`` and the run device of ``verify``."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old not in kwargs:
                    continue
                if new in kwargs:
                    raise TypeError(
                        f"{function.__name__}() takes {new}= alone ({old}= is its old name)"
                    )
                warnings.warn(
                    f"{function.__name__}({old}=...) is now {new}=...",
                    DeprecationWarning,
                    stacklevel=2,
                )
                kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return cast(F, wrapper)

    return decorate
