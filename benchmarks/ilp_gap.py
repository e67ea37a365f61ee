"""How far ``auto`` is from the exact op-graph optimum, on models small enough to prove it.

For each model, at budgets between the ``full`` and ``none`` peaks of the chain, ``auto``
(``dp`` over the blocks with per-block selective menus) picks a plan; the plan is written as a
schedule of the step's op graph (``ckptplan.planning.opgraph``: every forward and backward op, the
optimizer step left out) the way non-reentrant checkpoint runs it, and the exact solver
(``ckptplan.solvers.remat.solve``) gets that schedule's peak as its budget. Both schedules are
checked and costed by the independent checker; costs are nanoseconds of the roofline estimate.

The chain is built with ``scope="activations"``: the op graph counts op outputs only
(activations and gradients in flight, no parameters, parameter gradients, optimizer state or
batch), which is what that scope budgets.

    python benchmarks/ilp_gap.py [--time-limit 60] [--models mlp,gpt] [--out FILE]

Writes ``benchmarks/results/ilp_gap.json`` and prints a table. The target: ``auto`` within 3%
of the ILP's cost wherever the ILP proves optimality. Besides ``auto`` as ``solve`` runs it
(menus thinned to ``problem.MENU_POINTS`` options per block), each budget also runs ``auto``
over the whole selective frontier of every block, to show what the thinning costs.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import click
import torch
from rich.console import Console
from rich.table import Table

from ckptplan.loading import LiveModel, Workload, load_model_file
from ckptplan.planning.opgraph import GapReport, optimality_gap, to_remat_problem
from ckptplan.planning.problem import MENU_POINTS, selective_menus, to_chain
from ckptplan.profiling.profiler import Settings, profile_model
from ckptplan.solvers import run_solver
from ckptplan.solvers.chain import InfeasibleBudget

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = Path(__file__).parent / "results" / "ilp_gap.json"
FRACTIONS = (0.0, 0.2, 0.4, 0.6, 0.8)
"""Budgets as ``full peak + f * (none peak - full peak)`` of the chain (activations scope)."""
TARGET = 0.03
VARIANTS = {"auto": MENU_POINTS, "auto-unthinned": 0}
"""Solver label -> selective options per block (0: the whole frontier)."""


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    build: Callable[[], Workload]


def _mlp() -> Workload:
    """sample_models/mlp.py as shipped (16 blocks, width 512) at batch 64."""
    module = load_model_file(ROOT / "sample_models" / "mlp.py").module
    torch.manual_seed(0)
    return LiveModel(module.build_model(), module.example_inputs(64), module.loss_fn)


def _gpt() -> Workload:
    """sample_models/gpt.py cut down until the ILP proves optimality within a minute."""
    module = load_model_file(ROOT / "sample_models" / "gpt.py").module
    torch.manual_seed(0)
    model = module.GPT(vocab_size=128, block_size=64, n_layer=2, n_head=2, n_embd=64, dropout=0.0)
    batch = (torch.randint(0, 128, (2, 64)), torch.randint(0, 128, (2, 64)))
    return LiveModel(model, batch, module.loss_fn)


CASES = {
    "mlp": Case("mlp", "sample_models/mlp.py: 16 Linear+GELU blocks, width 512, batch 64", _mlp),
    "gpt": Case(
        "gpt",
        "sample_models/gpt.py: 2 blocks, width 64, 2 heads, 64 tokens, vocab 128, "
        "dropout 0 (flash SDPA), batch 2",
        _gpt,
    ),
}


def run_case(case: Case, time_limit_s: float, console: Console) -> dict[str, object]:
    """Profile one model and compare auto with the ILP at every budget."""
    started = time.perf_counter()
    # The op graph prices compute alone, so auto is compared in the same terms: without the
    # policy's dispatch cost that the cpu preset adds to selective options.
    profile = replace(
        profile_model(case.build(), Settings(device="cpu", optimizer="adamw")), policy_op_time=0.0
    )
    graph = to_remat_problem(profile)
    chains = {}
    for label, points in VARIANTS.items():
        menus = selective_menus(profile, points)
        chains[label] = (menus, to_chain(profile, "activations", menus))
    chain = chains["auto"][1]
    full = run_solver("full", chain, None).peak
    none = run_solver("none", chain, None).peak
    console.print(
        f"[bold]{case.name}[/]: {graph.n_ops} ops, {len(graph.problem.nodes)} nodes, "
        f"{len(graph.problem.edges)} edges; chain peaks full {full:,} B, none {none:,} B"
    )
    rows: list[dict[str, object]] = []
    for fraction in FRACTIONS:
        budget = int(full + fraction * (none - full))
        for label, (menus, variant) in chains.items():
            row: dict[str, object] = {"solver": label, "fraction": fraction, "chain_budget": budget}
            try:
                schedule = run_solver("auto", variant, budget)
            except InfeasibleBudget as exc:
                rows.append({**row, "infeasible": str(exc)})
                continue
            report = optimality_gap(
                profile, variant, schedule, time_limit_s, menus=menus, graph=graph
            )
            rows.append({**row, **report.to_json()})
            console.print(f"  f={fraction:.1f} {label}: {_summary(report)}")
    return {
        "model": case.name,
        "description": case.description,
        "blocks": len(profile.blocks),
        "ops": graph.n_ops,
        "nodes": len(graph.problem.nodes),
        "edges": len(graph.problem.edges),
        "total_cost": graph.total_cost,
        "chain_full_peak": full,
        "chain_none_peak": none,
        "seconds": time.perf_counter() - started,
        "rows": rows,
    }


def _summary(report: GapReport) -> str:
    gap = "-" if report.gap is None else f"{100 * report.gap:.2f}%"
    return (
        f"auto {report.auto_cost:,} vs ilp {report.ilp_cost or 0:,} ({report.ilp_status}, "
        f"{report.ilp_seconds:.1f} s): gap {gap}"
    )


def _percent(value: object) -> str:
    return "-" if value is None else f"{100 * float(value):.2f}"  # type: ignore[arg-type]


def print_table(cases: list[dict[str, object]], console: Console) -> None:
    table = Table(title="auto vs the op-graph ILP at auto's own peak (costs in ns)")
    for column in (
        "model",
        "solver",
        "f",
        "chain budget B",
        "op-graph peak B",
        "auto cost",
        "ilp cost",
        "status",
        "gap %",
        "recompute gap %",
        "vs bound %",
        "ilp s",
    ):
        left = column in ("model", "solver", "status")
        table.add_column(column, justify="left" if left else "right")
    for case in cases:
        for row in case["rows"]:  # type: ignore[attr-defined]
            if "infeasible" in row:
                table.add_row(
                    str(case["model"]),
                    str(row["solver"]),
                    f"{row['fraction']:.1f}",
                    f"{row['chain_budget']:,}",
                    "infeasible",
                )
                continue
            table.add_row(
                str(case["model"]),
                str(row["solver"]),
                f"{row['fraction']:.1f}",
                f"{row['chain_budget']:,}",
                f"{row['budget']:,}",
                f"{row['auto_cost']:,}",
                f"{row['ilp_cost']:,}" if row["ilp_cost"] is not None else "-",
                str(row["ilp_status"]),
                _percent(row["gap"]),
                _percent(row["recompute_gap"]),
                _percent(row["bound_gap"]),
                f"{row['ilp_seconds']:.1f}",
            )
    console.print(table)


def summarise(cases: list[dict[str, object]], solver: str) -> dict[str, object]:
    rows = [
        r
        for c in cases
        for r in c["rows"]  # type: ignore[attr-defined]
        if "gap" in r and r["solver"] == solver
    ]
    proven = [r for r in rows if r["ilp_status"] == "optimal"]
    within = [r for r in proven if r["gap"] is not None and r["gap"] <= TARGET]
    return {
        "target_gap": TARGET,
        "rows": len(rows),
        "proven_optimal": len(proven),
        "auto_within_target_where_proven": len(within),
        "max_gap_where_proven": max((r["gap"] for r in proven), default=None),
        "target_met": len(within) == len(proven),
    }


@click.command()
@click.option("--time-limit", default=60.0, show_default=True, help="ILP seconds per budget.")
@click.option("--models", default="mlp,gpt", show_default=True, help="Comma-separated cases.")
@click.option("--out", type=click.Path(path_type=Path), default=DEFAULT_OUT, show_default=True)
def main(time_limit: float, models: str, out: Path) -> None:
    """Run the benchmark and write its JSON."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=180)
    names = [m.strip() for m in models.split(",") if m.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise click.BadParameter(f"unknown model {unknown[0]}; choose from {', '.join(CASES)}")
    cases = [run_case(CASES[name], time_limit, console) for name in names]
    print_table(cases, console)
    summary = {label: summarise(cases, label) for label in VARIANTS}
    console.print(summary)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "benchmark": "ilp_gap",
        "time_limit_s": time_limit,
        "scope": "activations",
        "fractions": list(FRACTIONS),
        "menu_points": VARIANTS,
        "time_unit_s": 1e-9,
        "machine": {"python": platform.python_version(), "torch": torch.__version__},
        "summary": summary,
        "cases": cases,
    }
    out.write_text(json.dumps(data, indent=2) + "\n")
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
