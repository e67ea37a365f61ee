"""``ckptplan remat``: optimal rematerialization of a graph instance (no torch involved).

Registered into the CLI group with ``cli.add_command(remat)``. Imports only click, rich and
``ckptplan.solvers``, so it starts fast and works where torch is not installed.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import NoReturn

import click

from ckptplan.solvers.remat import (
    RematSchedule,
    Status,
    load_instance,
    memory_budget,
    peak_without_recomputation,
    solve,
)

__all__ = ["remat"]


def _fail(message: str) -> NoReturn:
    """One line on stderr and exit status 2, as for every input error of the CLI."""
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


def _positive(text: str, option: str) -> float:
    """Parsed here rather than by click so that a bad value gets the CLI's one-line error."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        _fail(f"{option} must be a positive number, got {text!r}")
    return value


@click.command("remat")
@click.argument("instance", metavar="INSTANCE.json")
@click.option(
    "--memory",
    "ratio_text",
    metavar="R",
    default="0.9",
    show_default=True,
    help="Budget as a fraction r of peak(T): ceil(peak(T) * r), T the networkx topological order.",
)
@click.option(
    "--time-limit",
    "time_limit_text",
    metavar="SECONDS",
    default="60",
    show_default=True,
    help="Seconds for the solver; it stops earlier once the schedule is proven optimal.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def remat(instance: str, ratio_text: str, time_limit_text: str, as_json: bool) -> None:
    """Cheapest recomputation schedule of INSTANCE.json within a memory budget.

    INSTANCE.json is a networkx node-link graph (Checkmate/Moccasin format: cost_cpu and cost_ram,
    or duration and out_cost). Prints the cost, the overhead over computing every node once,
    the peak, the budget, the proven gap, the solve time and the schedule (node ids in order).

    Exit status: 0 when a schedule is found or the budget is proven infeasible (status
    "infeasible"), 1 when no schedule was found and nothing was proven (status "unknown"), 2 on
    bad input (missing or malformed file, non-positive --memory or --time-limit).
    """
    start = time.perf_counter()
    ratio = _positive(ratio_text, "--memory")
    time_limit = _positive(time_limit_text, "--time-limit")
    path = Path(instance)
    if not path.is_file():
        _fail(f"instance file not found: {instance}")
    try:
        problem = load_instance(path)
    except (OSError, UnicodeDecodeError) as exc:
        _fail(f"cannot read {instance}: {exc}")
    except ValueError as exc:
        _fail(f"malformed instance {instance}: {exc}")
    budget = memory_budget(problem, ratio)
    result = solve(problem, budget, time_limit_s=time_limit)
    report = _report(problem.name, path, ratio, peak_without_recomputation(problem), result)
    report["wall_seconds"] = round(time.perf_counter() - start, 3)
    if as_json:
        click.echo(json.dumps({"schema": "ckptplan.remat/1", **report}))
    else:
        _print_table(problem.name, ratio, result)
    sys.exit(1 if result.status is Status.UNKNOWN else 0)


def _report(
    name: str, path: Path, ratio: float, plain_peak: int, result: RematSchedule
) -> dict[str, object]:
    return {
        "instance": str(path),
        "name": name,
        "memory_ratio": ratio,
        "peak_without_recomputation": plain_peak,
        "budget": result.budget,
        "status": result.status.value,
        "reason": result.reason,
        "cost": result.cost,
        "total_cost": result.total_cost,
        "overhead": result.overhead,
        "peak": result.peak,
        "lower_bound": result.lower_bound,
        "order_bound": result.order_bound,
        "gap": result.gap,
        "solve_seconds": round(result.solve_seconds, 3),
        "schedule": result.order,
    }


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.4f}%"


def _print_table(name: str, ratio: float, result: RematSchedule) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"remat {name} at memory {ratio}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("status", f"{result.status.value} ({result.reason})")
    table.add_row("cost", "-" if result.cost is None else str(result.cost))
    table.add_row("overhead", _percent(result.overhead))
    peak = "-" if result.peak is None else str(result.peak)
    table.add_row("peak / budget", f"{peak} / {result.budget}")
    table.add_row("proven gap", _percent(result.gap))
    table.add_row("solve time", f"{result.solve_seconds:.2f} s")
    recomputed = len(result.order) - len(set(result.order))
    plural = "" if recomputed == 1 else "s"
    table.add_row("schedule", f"{len(result.order)} steps, {recomputed} recomputation{plural}")
    console = Console()
    console.print(table)
    if result.order:
        console.print("schedule: " + " ".join(str(v) for v in result.order), soft_wrap=True)
