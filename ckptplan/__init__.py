"""ckptplan: find the best activation-checkpointing plan for a PyTorch model, and apply it.

The public API is imported lazily so that torch-free commands (``ckptplan remat``,
``ckptplan show``) never pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {
    "solve": "ckptplan.api",
    "apply": "ckptplan.train_api",
    "autoplan": "ckptplan.train_api",
    "verify": "ckptplan.api",
    "fit": "ckptplan.capacity",
    "profile": "ckptplan.api",
    "Plan": "ckptplan.values.plan",
    "HubModel": "ckptplan.hub",
    "Pipeline": "ckptplan.values.pipeline_types",
    "ProfileOptions": "ckptplan.options",
    "SolveOptions": "ckptplan.options",
    "Parallel": "ckptplan.options",
    "SolverOptions": "ckptplan.solvers",
    "solve_pipeline": "ckptplan.planning.pipeline",
    "CkptplanError": "ckptplan.errors",
}

# Modules exposed whole: ``ckptplan.rewrite`` is callable and carries ``save`` and ``rewrite_file``.
_MODULES = {"rewrite": "ckptplan.rewriting.graph"}

__all__ = ["__version__", *_API, *_MODULES]


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    raise AttributeError(f"module 'ckptplan' has no attribute {name!r}")
