"""ckptplan's compiled plans against ``torch.compile``'s own ``activation_memory_budget``.

For each model, on the CPU with one thread, dropout on, each of these trains the same seeded
steps from the same weights:

- eager with no checkpointing (the reference for gradients and time), and compiled with none;
- ``torch.compile`` with ``activation_memory_budget`` at 0.1, 0.3, 0.5 and 0.7;
- ckptplan ``--compile`` plans (``solve(..., compiled=True)``), applied then compiled, at byte
  budgets equal to the peaks those compile budgets measured, and at the least budgets whose
  aims (the compiled margin held back) admit those peaks;
- eager ``auto`` and ``dp`` plans at the same budgets, and for Hugging Face models HF's own
  checkpointing of every layer.

Every compiled entry runs inductor with ``fallback_random`` (eager's random kernels), so a
compiled step with the same seed draws eager's dropout masks and its gradients can be held to
eager's. For each entry: the peak the CPU allocator saw (``allocmeter``, which counts inductor's
buffers too; parameters, gradients, optimizer state and batch included), the step time against
eager and against compiled unchecked steps (medians of interleaved rounds, one process), the
compile time (the first step's time less a steady step's), and the largest gradient error
against eager, absolute and relative (per parameter, max |g - g_eager| / max |g_eager|), in
float32 as timed and again in float64 (Note [two gradient checks]).
Per point of compile's own budget, a ``verdict`` row names the ckptplan compiled plan whose
measured peak is no higher and which is fastest against that point, timed in pairs with it,
and whether it is faster beyond noise (Note [noise in the verdicts]). Each compiled entry also
records the graphs inductor compiled and the graph breaks dynamo counted while compiling it,
and each ckptplan plan its predicted recompute overhead beside the measured one (its step over
the compiled unchecked step's, less one, in back-to-back pairs as the verdicts are timed) and
how sure that is (Note [how sure a measured overhead is] in ``pair_stats.py``).
The Hugging Face Llama and ViT of ``benchmarks/models`` (12 layers, 256 and 577 tokens, the
libraries' defaults: issue 43) are measured lean (``LEAN``). A ``machine`` row per model
records the processor and the load (``uptime``) before and after: other jobs may share the
cores, and another host is another machine.

    python benchmarks/compile.py [--models sample_models/vit.py] [--rounds 9] [--pairs 24]
    python benchmarks/compile.py --models benchmarks/models/hf_llama_256.py \
        benchmarks/models/hf_vit_384.py --rounds 5 --pairs 8

Writes benchmarks/results/compile.json (rows merged by model) and compile.png, and each
ckptplan compiled plan it measured to benchmarks/results/compile_plans/<model>/, so that a
figure can be checked again on the very plan it was measured on.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from compile_plot import plot  # benchmarks/, the script's own folder
from pair_stats import overhead_check, paired, spread
from torch._functorch import config as functorch_config
from torch._inductor import config as inductor_config
from torch.utils._pytree import tree_map

import ckptplan
from ckptplan.devices import get_device
from ckptplan.errors import CkptplanError
from ckptplan.huggingface import training_conventions
from ckptplan.loading import Workload, call_model, load_model_file
from ckptplan.profiling.allocmeter import allocator_peak
from ckptplan.profiling.memtrack import keep_freed_host_memory, storage_bytes
from ckptplan.profiling.training import make_optimizer, persistent_tensors
from ckptplan.stepping.compiled import CompiledModel, Partition, inductor_backend
from ckptplan.stepping.graphbreaks import counting_breaks

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "compile.json"
PLANS = RESULTS.with_name("compile_plans")
MODELS = (
    "sample_models/gpt.py",
    "sample_models/vit.py",
    "sample_models/mlp.py",
    "tests/models/hf_gpt2.py",
    "tests/models/hf_llama.py",
    "tests/models/hf_bert.py",
    "tests/models/hf_vit.py",
    "benchmarks/models/hf_llama_256.py",
    "benchmarks/models/hf_vit_384.py",
)
COMPILE_BUDGETS = (0.1, 0.3, 0.5, 0.7)
LEAN = {"hf_llama_256": (0.3, 0.5, 0.7), "hf_vit_384": (0.3, 0.5, 0.7)}
"""Models as users build them (issue 43), measured at compile's 0.3, 0.5 and 0.7 only, with
one ckptplan compiled plan per point (at the point's peak) and no eager plans: their compiles
take minutes each. They have no dropout, so their gradients are judged in float32 against the
compiled unchecked step's own rounding (Note [two gradient checks])."""


class Entry:
    """One way of training the model: its module, the module owning the parameters, and its
    figures once measured."""

    def __init__(self, name: str, module: torch.nn.Module, owner: torch.nn.Module) -> None:
        self.name, self.module, self.owner = name, module, owner
        self.optimizer = make_optimizer("adamw", owner)
        self.row: dict[str, Any] = {"strategy": name}
        self.times: list[float] = []
        """Seconds per timed step, one per round."""


def step(workload: Workload, entry: Entry, inputs: Any, seed: int) -> None:
    torch.manual_seed(seed)
    workload.loss(call_model(entry.module, inputs)).backward()
    entry.optimizer.step()
    entry.optimizer.zero_grad(set_to_none=True)


def gradients(workload: Workload, entry: Entry, inputs: Any) -> dict[str, torch.Tensor]:
    torch.manual_seed(1234)
    workload.loss(call_model(entry.module, inputs)).backward()
    grads = {
        n: p.grad.detach().clone() for n, p in entry.owner.named_parameters() if p.grad is not None
    }
    entry.owner.zero_grad(set_to_none=True)
    return grads


def errors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> tuple[float, float]:
    """The largest absolute gradient difference, and the largest relative to its tensor's
    (Note [gradients that are zero])."""
    if got.keys() != want.keys():
        return float("inf"), float("inf")
    diffs = [((got[n] - g).abs().max().item(), g.abs().max().item()) for n, g in want.items()]
    floor = torch.finfo(torch.float32).eps * max(m for _, m in diffs)
    return max(d for d, _ in diffs), max(d / max(m, floor, 1e-30) for d, m in diffs)


# Note [gradients that are zero]
#     The key projection's bias has no gradient in exact arithmetic (softmax ignores a shift
#     shared by all keys), so eager's is rounding: 1e-11 of the model's largest gradient on
#     Hugging Face BERT and ViT, where every other tensor's is above 1e-3 of it. Compiled,
#     its rounding differs, and relative to its own size the error reads 1.7 in float64 as in
#     float32. A tensor's error is therefore taken relative to its largest eager gradient or to
#     float32's epsilon times the model's largest, whichever is the larger.


def measure(workload: Workload, entry: Entry, inputs: Any, want: dict[str, torch.Tensor]) -> None:
    """Gradients (the first call compiles), then a warm step, then the allocator's peak."""
    start = time.perf_counter()
    log = entry.row.get("partition", Partition())
    with counting_breaks(log):
        absolute, relative = errors(gradients(workload, entry, inputs), want)
    entry.row.update(grad_abs_diff=absolute, grad_rel_error=relative)
    first = time.perf_counter() - start
    step(workload, entry, inputs, seed=1)
    start = time.perf_counter()
    step(workload, entry, inputs, seed=2)
    steady = time.perf_counter() - start
    entry.row["compile_s"] = round(max(first - steady, 0.0), 2)
    persistent = storage_bytes(persistent_tensors(entry.owner, entry.optimizer, inputs))
    peak = allocator_peak(lambda: step(workload, entry, inputs, seed=3), entry.owner)
    entry.row["peak_bytes"] = persistent + peak.step


def compiled(name: str, model: torch.nn.Module, budget: float | None = None) -> Entry:
    log = Partition()
    entry = Entry(name, CompiledModel(model, inductor_backend(log)), model)
    entry.row["partition"] = log
    entry.row["memory_budget"] = budget
    return entry


def memory_budget(budget: float | None) -> contextlib.AbstractContextManager[Any]:
    """Compile's memory budget, if any, for the call that compiles."""
    if budget is None:
        return contextlib.nullcontext()
    return functorch_config.patch(activation_memory_budget=budget)


def float64_error(
    workload: Workload,
    entry: Entry,
    module: torch.nn.Module,
    inputs: Any,
    want: dict[str, torch.Tensor],
) -> None:
    """``entry`` built again, in float64, compiled, and its gradients held to eager's in
    float64 (Note [two gradient checks])."""
    double = compiled(entry.name, module.double(), entry.row.get("memory_budget"))
    with inductor_config.patch(fallback_random=True), memory_budget(double.row["memory_budget"]):
        entry.row["grad_rel_error_float64"] = errors(gradients(workload, double, inputs), want)[1]


# Note [two gradient checks]
#     Inductor's float32 kernels round differently from eager's (fused reductions, vectorised
#     transcendental functions): compiled with no plan at all, the ViT sample's gradients are
#     2.2e-6 from eager's. A plan that got a dropout mask or a recomputation wrong is off by
#     order one, which a float32 check tells apart too, but it cannot vouch for the sixth
#     digit. So each compiled entry is also built again in float64, with the same plan or
#     compile budget, after the timings, and held to eager in float64, where inductor's
#     rounding is near 1e-15 and any larger error is the plan's.


def time_rounds(workload: Workload, entries: list[Entry], inputs: Any, rounds: int) -> None:
    """Step time ratios against eager and compiled unchecked steps, per interleaved round; each
    entry's own times are kept for the verdicts' pairs."""
    keep_freed_host_memory()
    for r in range(rounds):
        for entry in entries if r % 2 == 0 else entries[::-1]:
            start = time.perf_counter()
            step(workload, entry, inputs, seed=10 + r)
            entry.times.append(time.perf_counter() - start)
    by_name = {e.name: e for e in entries}
    for entry in entries:
        for reference in ("eager", "compiled"):
            median, quartiles = paired(entry.times, by_name[reference].times)
            entry.row[f"time_vs_{reference}"] = median
            entry.row[f"time_vs_{reference}_quartiles"] = quartiles
        entry.row["step_s"] = round(statistics.median(entry.times), 4)


def verdicts(
    workload: Workload, entries: list[Entry], inputs: Any, pairs: int
) -> list[dict[str, Any]]:
    """For each point of compile's own budget, the ckptplan compiled plan whose measured peak
    is no higher and which ran fastest against it in the rounds, then timed against it again
    in ``pairs`` back-to-back pairs (Note [noise in the verdicts]); no plan where no ckptplan
    plan's peak is that low."""
    measured = [e for e in entries if "peak_bytes" in e.row and e.times]
    out = []
    for point in (e for e in measured if e.name.startswith("compile-")):
        ours = [
            e
            for e in measured
            if e.name.startswith("ckptplan-compiled")
            and e.row["peak_bytes"] <= point.row["peak_bytes"]
        ]
        verdict: dict[str, Any] = {
            "strategy": f"verdict@{point.name}",
            "point_peak_bytes": point.row["peak_bytes"],
            "point_time_vs_compiled": point.row["time_vs_compiled"],
        }
        if ours:
            best = min(ours, key=lambda e: paired(e.times, point.times)[0])
            ratios = back_to_back(workload, best, point, inputs, pairs)
            median, quartiles = spread(ratios)
            verdict.update(
                ckptplan=best.name,
                ckptplan_peak_bytes=best.row["peak_bytes"],
                ckptplan_time_vs_compiled=best.row["time_vs_compiled"],
                time_vs_point=median,
                time_vs_point_quartiles=quartiles,
                pairs=pairs,
            )
            verdict.update(
                at_least_as_fast=verdict["time_vs_point"] <= 1.0,
                faster_beyond_noise=verdict["time_vs_point_quartiles"][1] < 1.0,
                slower_beyond_noise=verdict["time_vs_point_quartiles"][0] > 1.0,
            )
        out.append(verdict)
    return out


def back_to_back(
    workload: Workload, mine: Entry, theirs: Entry, inputs: Any, pairs: int
) -> list[float]:
    """``mine``'s step time over ``theirs``', per pair of steps run one right after the other,
    which runs first alternating."""
    ratios = []
    for k in range(pairs):
        seconds = {}
        for entry in (mine, theirs) if k % 2 == 0 else (theirs, mine):
            start = time.perf_counter()
            step(workload, entry, inputs, seed=100 + k)
            seconds[entry.name] = time.perf_counter() - start
        ratios.append(seconds[mine.name] / seconds[theirs.name])
    return ratios


def measured_overheads(workload: Workload, entries: list[Entry], inputs: Any, pairs: int) -> None:
    """Each ckptplan compiled plan's overhead over the compiled unchecked step, timed in
    ``pairs`` back-to-back pairs with it (Note [noise in the verdicts]), held to its predicted
    overhead (``pair_stats.overhead_check``: Note [how sure a measured overhead is])."""
    unchecked = named(entries, "compiled")
    for entry in entries:
        predicted = entry.row.get("predicted_overhead")
        if predicted is None or not entry.name.startswith("ckptplan-compiled"):
            continue
        ratios = back_to_back(workload, entry, unchecked, inputs, pairs)
        entry.row.update(overhead_check(ratios, predicted))


# Note [noise in the verdicts]
#     Steps of one entry vary by 5-10% from round to round on this machine (interquartile range
#     of its ratio to the compiled unchecked step in a round of some twenty entries), as the
#     whole machine speeds up and slows down. So the plan a verdict names is timed again
#     against its point in pairs of steps run back to back, and the verdict is the median of
#     the pairs' ratios; "faster beyond noise" is their upper quartile below 1 (in three pairs
#     of four the plan was the faster), "slower beyond noise" their lower quartile above 1. Two
#     entries with the same partition (ckptplan's plan and compile's at the MLP's 0.5 point)
#     are then a tie, whichever median is the lower.


def run_model(path: Path, rounds: int, pairs: int) -> list[dict[str, Any]]:
    workload = load_model_file(path)
    torch.manual_seed(0)
    reference = workload.build().train()
    torch.manual_seed(0)
    inputs, _ = training_conventions(reference, workload.inputs(None))

    pristine = copy.deepcopy(reference)  # the eager entry trains ``reference`` itself

    def fresh() -> torch.nn.Module:
        return copy.deepcopy(pristine)

    lean = path.stem in LEAN
    budgets = LEAN.get(path.stem, COMPILE_BUDGETS)
    eager = Entry("eager", reference, reference)
    want = gradients(workload, eager, inputs)
    entries = [eager, compiled("compiled", fresh())]
    entries += [compiled(f"compile-{b:g}", fresh(), b) for b in budgets]
    rebuild: list[tuple[Entry, Callable[[], torch.nn.Module]]] = [(e, fresh) for e in entries[1:]]
    for entry in entries:
        budget = entry.row.get("memory_budget")
        with inductor_config.patch(fallback_random=True), memory_budget(budget):
            measure(workload, entry, inputs, want)
    planned = []
    margin = get_device("cpu", compiled=True).margin_percent
    for budget_entry in entries[2 : 2 + len(budgets)]:
        point = budget_entry.row["peak_bytes"]
        tag = f"@{budget_entry.name}"
        runs = [("auto", True, point, "")]
        if not lean:
            runs += [("auto", False, point, ""), ("dp", False, point, "")]
            # The least budget whose aim, the margin held back, admits the point's peak.
            runs.append(("auto", True, math.ceil(point / (1 - margin / 100)), "+margin"))
        for solver, compile_plan, budget, suffix in runs:
            base = "ckptplan-compiled" if compile_plan else f"eager-{solver}"
            name = f"{base}{tag}{suffix}"
            try:
                plan = ckptplan.solve(path, budget=budget, solver=solver, compiled=compile_plan)
            except CkptplanError as exc:
                planned.append({"strategy": name, "budget_bytes": budget, "infeasible": str(exc)})
                continue
            model = ckptplan.apply(fresh(), plan)
            entry = compiled(name, model) if compile_plan else Entry(name, model, model)
            entry.row.update(
                budget_bytes=budget,
                predicted_peak_bytes=plan.predicted.fake_run_peak_bytes,
                predicted_overhead=plan.predicted.overhead,
            )
            with inductor_config.patch(fallback_random=True):
                measure(workload, entry, inputs, want)
            entries.append(entry)
            if compile_plan:
                (PLANS / path.stem).mkdir(parents=True, exist_ok=True)
                plan.save(PLANS / path.stem / f"{name.removeprefix(base + '@')}.json")
                rebuild.append((entry, lambda plan=plan: ckptplan.apply(fresh(), plan)))
    if hasattr(reference, "activation_checkpointing_enable") and not lean:
        model = fresh()
        model.activation_checkpointing_enable({"use_reentrant": False})
        entry = Entry("hf-full", model, model)
        measure(workload, entry, inputs, want)
        entries.append(entry)
    compiles = {e.name: e.row["partition"].compiled_graphs for e in entries if "partition" in e.row}
    print(f"{path.stem}: timing", flush=True)
    time_rounds(workload, entries, inputs, rounds)
    for entry in entries:
        if (
            "partition" in entry.row
            and entry.row["partition"].compiled_graphs != compiles[entry.name]
        ):
            raise RuntimeError(
                f"{entry.name} compiled again while timed: its times are not its own"
            )
    judged = verdicts(workload, entries, inputs, pairs)
    measured_overheads(workload, entries, inputs, pairs)
    inputs64 = tree_map(
        lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t, inputs
    )
    eager64 = fresh().double()
    want64 = gradients(workload, Entry("eager", eager64, eager64), inputs64)
    # Without dropout, float32 tells a wrong gradient (order one) from inductor's rounding:
    # within ten times the compiled unchecked step's own error.
    rounding = 10 * named(entries, "compiled").row["grad_rel_error"] + 1e-6
    for entry, build in [] if lean else rebuild:
        float64_error(workload, entry, build(), inputs64, want64)
    for verdict in judged:
        point = named(entries, verdict["strategy"].removeprefix("verdict@"))
        verdict["point_gradients_correct"] = (
            point.row["grad_rel_error"] <= rounding
            if lean
            else point.row["grad_rel_error_float64"] <= 1e-6
        )
    rows = []
    for entry in entries:
        row = dict(entry.row, model=path.stem)
        log = row.pop("partition", None)
        if log is not None:
            row["saved_bytes"] = log.saved_bytes
            row["graphs"] = log.compiled_graphs
            row["graph_breaks"] = log.graph_breaks
        rows.append(row)
    return rows + planned + judged


def named(entries: list[Entry], name: str) -> Entry:
    return next(e for e in entries if e.name == name)


def load() -> str:
    """The machine's load as ``uptime`` puts it: other jobs share these cores."""
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def processor() -> str:
    """The CPU the times come from and its last-level cache: a plan's overhead depends on
    them, and runs on another host measure another machine."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    name = next((line.split(":", 1)[1].strip() for line in lines if "model name" in line), "?")
    caches = sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"))
    return f"{name}, last-level cache {caches[-1].read_text().strip() if caches else '?'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--pairs", type=int, default=24, help="back-to-back pairs per verdict")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # Each entry compiles the same forward with its own backend: a cache entry each.
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 4096
    results: dict[str, Any] = {}
    for name in args.models:
        path = ROOT / name
        print(f"{path.stem}: measuring", flush=True)
        before = load()
        rows = run_model(path, args.rounds, args.pairs)
        rows.append(
            {
                "strategy": "machine",
                "threads": 1,
                "processor": processor(),
                "uptime_before": before,
                "uptime_after": load(),
            }
        )
        # Read again: another run of this script, on other models, may have written since.
        results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        results[path.stem] = rows
        print(f"{path.stem}: written", flush=True)
        torch._dynamo.reset()
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    plot(results, RESULTS.with_suffix(".png"))


if __name__ == "__main__":
    main()
