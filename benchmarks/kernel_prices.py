"""Each kernel of a compiled step timed where it runs, beside the price ckptplan gives it
(Note [pricing the partition] in ``ckptplan.stepping.graphcost``): the instrument behind the
pricing notes, finer than the whole-step timings of ``compile.py`` that test predictions.

For each model: the compiled unchecked step and ``dp`` plans at a few budgets (or the plan
files given, such as those ``compile.py`` measured), applied then compiled, on the CPU with
one thread, freed memory kept by malloc. Inductor compiles each graph for real, and the same
graph is lowered again as the fake run lowers it (``graph_memory``: the scheduler's kernels),
whose kernels ``kernel_seconds`` prices. Every kernel and library call of the generated code
runs under a timer; the entries' steps run interleaved, and a call's time is its median over
the steps. A call's price is the sum of the priced kernels whose buffers it writes
(inductor's code generator may merge scheduler nodes into one loop). Per model it reports,
per class (pointwise kernels, library calls), the seconds measured and priced and the
time-weighted mean |log(price / time)|; and per plan its graphs' time over the unchecked
step's, less one, measured and priced, and where that difference lies: per pass (forward,
backward) and call (pointwise kernels, each library function), the plan's seconds less the
unchecked step's, measured and priced. The timers add about a microsecond a call, a few
percent of a step: the step's wall time is recorded too.

    python benchmarks/kernel_prices.py [--models benchmarks/models/hf_llama_256.py] \
        [--budgets 60% 75% 90%] [--steps 10]
    python benchmarks/kernel_prices.py --models benchmarks/models/hf_vit_384.py \
        --plans benchmarks/results/compile_plans/hf_vit_384/*.json

Writes benchmarks/results/kernel_prices.json (rows merged by model; plan files' runs under
"<model> plans").
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import re
import statistics
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch._functorch import config as functorch_config
from torch._inductor import config as inductor_config
from torch._inductor.compile_fx import compile_fx, compile_fx_inner
from torch._inductor.select_algorithm import extern_kernels

import ckptplan
from ckptplan.devices import get_device
from ckptplan.huggingface import training_conventions
from ckptplan.loading import Workload, call_model, load_model_file
from ckptplan.profiling.memtrack import keep_freed_host_memory
from ckptplan.profiling.training import make_optimizer
from ckptplan.stepping.compiled import CompiledModel
from ckptplan.stepping.inductor_memory import graph_memory
from ckptplan.stepping.kernelcost import kernel_seconds

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "kernel_prices.json"
MODELS = ("benchmarks/models/hf_llama_256.py", "benchmarks/models/hf_vit_384.py")
CALL = re.compile(
    r"^\s+(?:(?P<kernel>cpp_\w+)\((?P<args>.*)\)$"  # a generated kernel: its buffers
    r"|.*extern_kernels\.(?P<extern>\w+)\(.*out=(?P<out>\w+)\)$"  # a library call into a buffer
    r"|(?P<result>\w+) = extern_kernels\.(?P<returning>\w+)\("  # ... returning its result
    r"|(?P<aten_result>\w+) = (?:torch\.ops\.higher_order\.\w+\((?:\w+, )?)?"
    r"torch\.ops\.aten\.(?P<aten>\w+)\.\w+[(,])"  # an aten call, or one under an RNG wrapper
)


@dataclass
class Graph:
    """One compiled graph: the calls its code makes, in order, with the buffers each writes;
    the price of each call; and each call's seconds, one list per timed step."""

    entry: str
    backward: bool
    calls: list[tuple[str, list[str]]]
    prices: list[float]
    unnamed: float
    """The price of kernels no call of the code names (left out of every figure)."""
    runs: list[list[tuple[str, float]]] = field(default_factory=list)

    def times(self) -> list[float] | None:
        """Each call's median seconds; None where a step ran calls the code does not list."""
        names = [name for name, _ in self.calls]
        runs = [run for run in self.runs if [name for name, _ in run] == names]
        if not runs or len(runs) < len(self.runs):
            return None
        return [statistics.median(run[i][1] for run in runs) for i in range(len(names))]


def code_calls(source: str) -> list[tuple[str, list[str]]]:
    """The kernel and library calls of inductor's generated ``source``, in order."""
    body = source[source.find("def call(") :]
    found = []
    for line in body.splitlines():
        match = CALL.match(line)
        if match is None:
            continue
        if match["kernel"]:
            found.append((match["kernel"], re.findall(r"\b\w+\b", match["args"])))
        elif match["extern"]:
            found.append(("extern." + match["extern"], [match["out"]]))
        elif match["returning"]:
            found.append(("extern." + match["returning"], [match["result"]]))
        else:
            found.append(("aten." + match["aten"], [match["aten_result"]]))
    return found


def call_prices(
    calls: list[tuple[str, list[str]]], kernels: Any, seconds: list[float]
) -> tuple[list[float], float]:
    """Each call's price (the priced kernels that write a buffer it names first), and the
    price of the kernels no call names."""
    caller: dict[str, int] = {}
    for i, (_, buffers) in enumerate(calls):
        for name in buffers:
            caller.setdefault(name, i)
    prices = [0.0] * len(calls)
    unnamed = 0.0
    for kernel, price in zip(kernels, seconds, strict=True):
        owner = next((caller[n] for n, _ in kernel.writes if n in caller), None)
        if owner is None:
            unnamed += price
        else:
            prices[owner] += price
    return prices, unnamed


def timed_module(scope: dict[str, Any], graph: Graph, timing: list[bool]) -> None:
    """Wrap the generated module's kernels and library calls (its globals ``scope``) in timers
    that append to ``graph.runs[-1]`` while ``timing[0]``."""

    def timer(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            if timing[0]:
                graph.runs[-1].append((name, time.perf_counter() - start))
            return out

        return run

    for name, value in list(scope.items()):
        if name.startswith("cpp_"):
            scope[name] = timer(name, value)

    class Namespace:
        def __init__(self, lookup: Callable[[str], Any]) -> None:
            self.lookup = lookup

        def __getattr__(self, name: str) -> Any:
            return self.lookup(name)

    def aten_op(name: str) -> Any:
        packet = getattr(torch.ops.aten, name)
        return Namespace(lambda overload: timer("aten." + name, getattr(packet, overload)))

    scope["extern_kernels"] = Namespace(lambda n: timer("extern." + n, getattr(extern_kernels, n)))
    ops = Namespace(lambda n: Namespace(aten_op) if n == "aten" else getattr(torch.ops, n))
    scope["torch"] = types.SimpleNamespace(**{**vars(torch), "ops": ops})


def recording_backend(entry: str, graphs: list[Graph], timing: list[bool]) -> Callable:
    """Inductor, each graph also lowered as ckptplan prices it and its code put under timers."""
    device = get_device("cpu", compiled=True)

    def inner(graph: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        memory = graph_memory(graph, example_inputs, bool(kwargs.get("is_backward")))
        compiled = compile_fx_inner(graph, example_inputs, **kwargs)
        if memory is not None and memory.kernels is not None:
            calls = code_calls(compiled.source_code)
            seconds = kernel_seconds(memory.kernels, device)
            backward = bool(kwargs.get("is_backward"))
            record = Graph(entry, backward, calls, *call_prices(calls, memory.kernels, seconds))
            graphs.append(record)
            timed_module(compiled.current_callable.__globals__, record, timing)
        return compiled

    def backend(graph: torch.fx.GraphModule, inputs: Any) -> Any:
        # A hit in AOTAutograd's cache would load the graphs without compiling them here.
        with functorch_config.patch(enable_autograd_cache=False):
            return compile_fx(graph, inputs, inner_compile=inner)

    return backend


def run_model(
    path: Path, budgets: list[str], steps: int, plans: list[Path] | None = None
) -> dict[str, Any]:
    """The figures of the module docstring for the model at ``path``: ``dp`` plans at
    ``budgets``, or the plan files ``plans`` (named by their stems) where given."""
    workload: Workload = load_model_file(path)
    torch.manual_seed(0)
    pristine = workload.build().train()
    inputs, _ = training_conventions(pristine, workload.inputs(None))
    entries: dict[str, torch.nn.Module] = {"unchecked": copy.deepcopy(pristine)}
    chosen: dict[str, ckptplan.Plan | Path] = (
        {file.stem: file for file in plans}
        if plans
        else {f"dp@{b}": ckptplan.solve(path, budget=b, solver="dp") for b in budgets}
    )
    for name, plan in chosen.items():
        entries[name] = ckptplan.apply(copy.deepcopy(pristine), plan)
    graphs: list[Graph] = []
    timing = [False]
    compiled = {}
    for name, module in entries.items():
        model = CompiledModel(module, recording_backend(name, graphs, timing))
        optimizer = make_optimizer("adamw", module)
        assert optimizer is not None
        compiled[name] = (model, optimizer)
    walls: dict[str, list[float]] = {name: [] for name in entries}
    for k in range(steps + 2):  # two warm-up steps: compiling, then the loss's recompile
        timing[0] = k >= 2
        for name, (model, optimizer) in compiled.items():
            for graph in graphs:
                graph.runs.append([])
            torch.manual_seed(k)
            start = time.perf_counter()
            # Eager's random kernels, as compile.py times them: dropout is a library call.
            with inductor_config.patch(fallback_random=True):
                workload.loss(call_model(model, inputs)).backward()
            walls[name].append(time.perf_counter() - start)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return summary(graphs, walls)


def summary(graphs: list[Graph], walls: dict[str, list[float]]) -> dict[str, Any]:
    """The timed steps' figures: per class of call, and per entry (the module docstring)."""
    classes: dict[str, list[float]] = {}  # class -> [measured, priced, weighted |log ratio|]
    # entry -> "pass call" (e.g. "backward pointwise", "forward extern.mm") -> [measured, priced]
    parts: dict[str, dict[str, list[float]]] = {name: {} for name in walls}
    unmatched = 0
    unnamed = 0.0
    for graph in graphs:
        graph.runs = [run for run in graph.runs if run]
        if not graph.runs:
            continue  # compiled, but not run in the timed steps
        times = graph.times()
        if times is None:
            unmatched += 1
            continue
        unnamed += graph.unnamed
        for (name, _), measured, priced in zip(graph.calls, times, graph.prices, strict=True):
            cls = "pointwise" if name.startswith("cpp_") else "library"
            part = ("backward " if graph.backward else "forward ") + (
                "pointwise" if cls == "pointwise" else name
            )
            seconds = parts[graph.entry].setdefault(part, [0.0, 0.0])
            seconds[0] += measured
            seconds[1] += priced
            row = classes.setdefault(cls, [0.0, 0.0, 0.0])
            row[0] += measured
            row[1] += priced
            row[2] += measured * abs(math.log(max(priced, 1e-9) / measured))
    totals = {
        name: [sum(seconds[i] for seconds in calls.values()) for i in (0, 1)]
        for name, calls in parts.items()
    }
    measured_base, priced_base = totals["unchecked"]
    entries = {
        name: {
            "graphs_measured_s": m,
            "graphs_priced_s": p,
            "overhead_measured": m / measured_base - 1,
            "overhead_priced": p / priced_base - 1,
            "forward_backward_wall_s": statistics.median(walls[name][2:]),
        }
        for name, (m, p) in totals.items()
    }
    for name, row in entries.items():
        if name != "unchecked":
            row["difference_s"] = differences(parts[name], parts["unchecked"])
    return {
        "classes": {
            cls: {"measured_s": m, "priced_s": p, "mean_abs_log_ratio": w / m}
            for cls, (m, p, w) in classes.items()
        },
        "graphs_unmatched": unmatched,
        "priced_unnamed_s": unnamed,
        "entries": entries,
    }


def differences(
    mine: dict[str, list[float]], theirs: dict[str, list[float]]
) -> dict[str, dict[str, float]]:
    """Per part, ``mine``'s seconds less ``theirs``', measured and priced."""
    out = {}
    for part in sorted(mine.keys() | theirs.keys()):
        a, b = mine.get(part, [0.0, 0.0]), theirs.get(part, [0.0, 0.0])
        out[part] = {"measured": a[0] - b[0], "priced": a[1] - b[1]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--budgets", nargs="+", default=["60%", "75%", "90%"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--plans", nargs="+", type=Path, help="plan files of the one model, timed instead of dp's"
    )
    args = parser.parse_args()
    if args.plans and len(args.models) != 1:
        parser.error("--plans needs exactly one model in --models, the one the plans are for")
    torch.set_num_threads(1)
    keep_freed_host_memory()
    # Each entry compiles the same forward with its own backend: a cache entry each.
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 4096
    for name in args.models:
        path = ROOT / name
        before = os.getloadavg()[0]
        row = run_model(path, args.budgets, args.steps, args.plans)
        row["load_average_1min"] = [before, os.getloadavg()[0]]
        results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        results[f"{path.stem} plans" if args.plans else path.stem] = row
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
        torch._dynamo.reset()
        for cls, figures in row["classes"].items():
            print(f"{path.stem} {cls}: " + ", ".join(f"{k} {v:.4g}" for k, v in figures.items()))
        for entry, figures in row["entries"].items():
            print(
                f"{path.stem} {entry}: overhead measured {figures['overhead_measured']:+.2%}"
                f" priced {figures['overhead_priced']:+.2%}"
            )
            for part, seconds in figures.get("difference_s", {}).items():
                print(
                    f"    {part}: measured {seconds['measured'] * 1e3:+.1f} ms,"
                    f" priced {seconds['priced'] * 1e3:+.1f} ms"
                )


if __name__ == "__main__":
    main()
