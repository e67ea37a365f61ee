"""Names of the choices the CLI offers, importable without torch."""

from __future__ import annotations

import re
from pathlib import Path

OPTIMIZERS = ("adamw", "adam", "sgd", "none")
DTYPES = ("fp32", "bf16", "fp16")
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
