"""The modules that must import without torch: the solvers, the boundary types every stage
reads (the plan, the profile's data, the options, the Hugging Face conventions), the problem
that turns a profile into the solvers' plain numbers, and the CLI's entry (``ckptplan remat``
and ``show`` need no torch)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.torchfree

TORCH_FREE = (
    "solvers",
    "solvers.chain",
    "solvers.dp",
    "solvers.selective",
    "solvers.remat",
    "ckptplan.values.plan",
    "ckptplan.values.plan_fields",
    "ckptplan.values.prediction",
    "ckptplan.values.policy_types",
    "ckptplan.values.phase",
    "ckptplan.values.peak_event",
    "ckptplan.values.profile_types",
    "ckptplan.values.pipeline_types",
    "ckptplan.values.budget",
    "ckptplan.values.unit_names",
    "ckptplan.planning.problem",
    "ckptplan.options",
    "ckptplan.devices",
    "ckptplan.errors",
    "ckptplan.huggingface",
    "ckptplan.cli.remat",
    "ckptplan.cli.main",
)


def imports_without_torch(module: str) -> subprocess.CompletedProcess[str]:
    """``import module`` in a fresh interpreter where any import of torch raises."""
    code = f"import sys; sys.modules['torch'] = None; import {module}"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


@pytest.mark.parametrize("module", TORCH_FREE)
def test_the_module_imports_with_torch_blocked(module: str) -> None:
    done = imports_without_torch(module)
    assert done.returncode == 0, f"{module} needs torch: {done.stderr.strip().splitlines()[-1]}"


def test_blocking_torch_is_seen() -> None:
    done = imports_without_torch("ckptplan.profiling.profiler")
    assert done.returncode != 0, "the profiler traces with torch: the block must stop it"
