"""A training job's ``import ckptplan; ckptplan.apply(model, "plan.json")`` loads only the
runtime: none of the planner, its solvers' libraries (ortools, networkx) or the CLI's (rich,
click), and no torch compiler module that torch's own checkpoint does not load. No module it
loads names a private torch API (``tests/private_torch.py``): the runtime's one that does, eager
offload's, loads only for a plan that offloads in eager mode.

Each side runs in a fresh interpreter, so what the test process imported does not count: a step
with the plan applied, and the same step with the same blocks checkpointed by torch alone (whose
``checkpoint`` imports ``torch._dynamo`` at its first call, so a plain step is no baseline). The
time that importing ckptplan and applying the plan adds is printed (``-s``), not asserted.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptplan
from ckptplan.loading import load_model_file
from tests.conftest import ROOT
from tests.private_torch import KEPT, private_torch
from tests.test_module_boundaries import PLANNER

pytestmark = pytest.mark.runtime  # run on the lowest and newest torch supported too (.ci/run)

HEAVY = ("ortools", "networkx", "rich", "click", "torch._dynamo", "torch._inductor")
"""What the planner imports and a training job should not pay for, or be broken by."""

STEP = """
import functools, importlib.util, json, sys, time
started = time.perf_counter()
import pytest
import torch
torch_s = time.perf_counter() - started
spec = importlib.util.spec_from_file_location("model_file", sys.argv[1])
model_file = importlib.util.module_from_spec(spec)
spec.loader.exec_module(model_file)
torch.manual_seed(0)
model = model_file.build_model().train()
started = time.perf_counter()
if sys.argv[2] == "ckptplan":
    import ckptplan
    model = ckptplan.apply(model, sys.argv[3])
else:  # the same blocks, checkpointed by torch alone
    from torch.utils.checkpoint import checkpoint
    for layer in model.layers:
        layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)
added_s = time.perf_counter() - started
model(*model_file.example_inputs(2)).backward()
applied = getattr(model, "ckptplan_applied", None)
recomputed = None if applied is None else applied.recomputed
print(json.dumps({"modules": sorted(sys.modules), "torch_s": torch_s, "added_s": added_s,
                  "recomputed": recomputed}))
"""


def _step(model_file: Path, *args: str) -> dict[str, Any]:
    """What a fresh interpreter imported for one training step, and how long the imports took."""
    command = [sys.executable, "-c", STEP, str(model_file), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def _heavy(module: str) -> bool:
    return any(module == name or module.startswith(f"{name}.") for name in HEAVY)


def _private_torch(modules: list[str], allowed: set[str]) -> dict[str, list[str]]:
    """The private torch names each of ``modules`` of ckptplan uses, but those ``allowed``."""
    found = {}
    for name in modules:
        if name != "ckptplan" and not name.startswith("ckptplan."):
            continue
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        uses = private_torch(Path(spec.origin).read_text())
        found[name] = [use for use in uses if use.partition(": ")[2] not in allowed]
    return {name: uses for name, uses in found.items() if uses}


def _planner(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "ckptplan" and len(parts) > 1 and parts[1] in PLANNER


def test_applying_a_plan_loads_only_the_runtime(tiny_gpt: Path, tmp_path: Path) -> None:
    workload = load_model_file(tiny_gpt)
    torch.manual_seed(0)
    plan = ckptplan.solve(
        workload.module.build_model(), workload.inputs(2), budget="60%", solver="full"
    )
    assert plan.regions
    plan.save(tmp_path / "plan.json")

    by_torch = _step(tiny_gpt, "torch")
    planned = _step(tiny_gpt, "ckptplan", str(tmp_path / "plan.json"))

    assert planned["recomputed"] == len(plan.regions)
    added = set(planned["modules"]) - set(by_torch["modules"])
    assert sorted(filter(_heavy, added)) == []
    assert sorted(filter(_planner, planned["modules"])) == []
    assert _private_torch(planned["modules"], allowed=set()) == {}
    print(
        f"import torch: {by_torch['torch_s']:.3f} s; import ckptplan and apply: "
        f"{planned['added_s']:.3f} s; torch's checkpoint on every block: "
        f"{by_torch['added_s']:.3f} s"
    )


def test_the_runtime_names_no_private_torch_but_eager_offload() -> None:
    """Every module of the runtime, loaded or not: only eager offload's keeps a private name
    (``tests/private_torch.py``), and it is loaded by the plans that offload in eager mode."""
    runtime = [
        "ckptplan.train_api",
        *(f"ckptplan.applying.{p.stem}" for p in (ROOT / "ckptplan" / "applying").glob("*.py")),
    ]
    assert _private_torch(runtime, allowed=set(KEPT)) == {}
    assert set(_private_torch(runtime, allowed=set())) == {"ckptplan.applying.offload"}
