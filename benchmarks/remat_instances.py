"""Benchmark ``ckptplan remat`` on the Checkmate instances against Moccasin's reference results.

Every instance runs at memory 0.9 and 0.8 through the command itself (a fresh interpreter, so the
wall time includes start-up and imports), every schedule is verified with the independent
checker, and the results go to ``benchmarks/results/remat.json``.

    python benchmarks/remat_instances.py [--time-limit 120] [--instances DIR] [--out FILE]

The reference (README of the instances) prints overheads rounded, so "<= ref" compares at the
reference's printed precision. The speed target is ``reference solve time / 5 + 2 s`` for the
whole command.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from ckptplan.solvers.remat import load_instance
from ckptplan.solvers.remat_check import check_schedule

DEFAULT_INSTANCES = Path(
    os.environ.get(
        "CKPTPLAN_REMAT_INSTANCES",
        Path(__file__).resolve().parents[2] / "shared" / "remat-instances",
    )
)
"""The Checkmate instances: ``$CKPTPLAN_REMAT_INSTANCES``, else ``shared/remat-instances``
beside the repository."""
DEFAULT_OUT = Path(__file__).parent / "results" / "remat.json"
COMMAND = "from ckptplan.cli.remat import remat; remat()"


@dataclass(frozen=True)
class Reference:
    """Moccasin on 2 cores with 120 s, as printed in the README (``None``: no schedule)."""

    overhead_text: str | None
    seconds: float
    infeasible: bool = False

    @property
    def overhead(self) -> float | None:
        return None if self.overhead_text is None else float(self.overhead_text) / 100

    @property
    def decimals(self) -> int:
        text = self.overhead_text or ""
        return len(text.split(".")[1]) if "." in text else 0


REFERENCE: dict[tuple[str, float], Reference] = {
    ("vgg16_b256_train", 0.9): Reference("1.97", 1.9),
    ("vgg16_b256_train", 0.8): Reference(None, 1.5, infeasible=True),
    ("vgg19_b256_train", 0.9): Reference("0.10", 6.6),
    ("vgg19_b256_train", 0.8): Reference("4.85", 4.3),
    ("vgg_unet_b32_train", 0.9): Reference("1.13", 14.6),
    ("vgg_unet_b32_train", 0.8): Reference("1.98", 15.6),
    ("fcn_8_vgg_b32_train", 0.9): Reference("0.029", 14.2),
    ("fcn_8_vgg_b32_train", 0.8): Reference("0.136", 12.8),
    ("segnet_b32_train", 0.9): Reference("0.103", 23.4),
    ("segnet_b32_train", 0.8): Reference("0.207", 15.4),
    ("mobilenet_b512_train", 0.9): Reference(None, 120.0),
    ("mobilenet_b512_train", 0.8): Reference(None, 120.0),
    ("resnet50_b256_train", 0.9): Reference(None, 120.0),
    ("resnet50_b256_train", 0.8): Reference(None, 120.0),
}
RATIOS = (0.9, 0.8)


@dataclass
class Row:
    instance: str
    memory: float
    budget: int
    status: str
    reason: str
    overhead: float | None
    proof: str
    order_bound_overhead: float | None
    gap: float | None
    peak: int | None
    verified: bool
    solve_seconds: float
    command_seconds: float
    reference_overhead: float | None
    reference_seconds: float
    target_seconds: float
    beats_or_ties_reference: bool | None
    within_time_target: bool
    schedule_length: int


def run_case(path: Path, ratio: float, time_limit: float) -> Row:
    """Run the command on one instance and check what it printed."""
    start = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            COMMAND,
            str(path),
            "--memory",
            str(ratio),
            "--time-limit",
            str(time_limit),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{path.name} at {ratio}: exit {done.returncode}: {done.stderr}")
    report = json.loads(done.stdout)
    problem = load_instance(path)
    verified = report["status"] == "infeasible"
    if report["schedule"]:
        cost, peak = check_schedule(problem, report["schedule"], report["budget"])
        verified = cost == report["cost"] and peak == report["peak"]
    total = report["total_cost"]
    ref = REFERENCE[(path.stem, ratio)]
    beats: bool | None = None
    if ref.infeasible:
        beats = report["status"] == "infeasible"
    elif ref.overhead is not None and report["overhead"] is not None:
        beats = round(100 * report["overhead"], ref.decimals) <= float(ref.overhead_text or 0)
    target = round(ref.seconds / 5 + 2, 2)
    bound = report["order_bound"] / total - 1 if total and report["schedule"] else None
    return Row(
        instance=path.stem,
        memory=ratio,
        budget=report["budget"],
        status=report["status"],
        reason=report["reason"],
        overhead=report["overhead"],
        proof=_proof(report),
        order_bound_overhead=bound,
        gap=report["gap"],
        peak=report["peak"],
        verified=verified,
        solve_seconds=report["solve_seconds"],
        command_seconds=round(wall, 3),
        reference_overhead=ref.overhead,
        reference_seconds=ref.seconds,
        target_seconds=target,
        beats_or_ties_reference=beats,
        within_time_target=wall <= target,
        schedule_length=len(report["schedule"]),
    )


def _proof(report: dict) -> str:
    """What the status rests on, in a few words."""
    if report["status"] == "infeasible":
        return "memory lower bound"
    if report["status"] != "optimal":
        return "-"
    if report["cost"] == report["total_cost"]:
        return "no recomputation"
    if report["cost"] <= report["order_bound"]:
        return "any T-first schedule"
    return "stage model"


def _pct(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}%"


def print_table(rows: list[Row]) -> None:
    table = Table(title="ckptplan remat vs Moccasin (README reference)")
    for name in (
        "instance",
        "r",
        "status",
        "proof",
        "overhead",
        "Moccasin",
        "<= ref",
        "T-first bound",
        "checked",
        "command s",
        "Moccasin s",
        "target s",
        "in time",
    ):
        table.add_column(name, justify="left" if name in ("instance", "status") else "right")
    for row in rows:
        ref = REFERENCE[(row.instance, row.memory)]
        reference = (
            "infeasible"
            if ref.infeasible
            else (f"{ref.overhead_text}%" if ref.overhead_text else "none found")
        )
        table.add_row(
            row.instance.removesuffix("_train"),
            str(row.memory),
            row.status,
            row.proof,
            _pct(row.overhead),
            reference,
            {True: "yes", False: "NO", None: "-"}[row.beats_or_ties_reference],
            _pct(row.order_bound_overhead),
            "yes" if row.verified else "NO",
            f"{row.command_seconds:.2f}",
            f"{row.reference_seconds:g}",
            f"{row.target_seconds:.2f}",
            "yes" if row.within_time_target else "NO",
        )
    Console(width=170).print(table)


@click.command()
@click.option(
    "--time-limit", type=float, default=120.0, show_default=True, help="Solver seconds per case."
)
@click.option(
    "--instances",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=DEFAULT_INSTANCES,
    show_default=True,
)
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), default=DEFAULT_OUT, show_default=True
)
def main(time_limit: float, instances: Path, out: Path) -> None:
    """Run every instance at memory 0.9 and 0.8 and compare with the reference."""
    rows = [
        run_case(instances / f"{name}.json", ratio, time_limit)
        for name in dict.fromkeys(name for name, _ in REFERENCE)
        for ratio in RATIOS
    ]
    print_table(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "time_limit_s": time_limit,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": _cpus(),
        "command": COMMAND,
    }
    out.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    click.echo(f"wrote {out}")
    if not all(r.verified for r in rows):
        sys.exit(1)


def _cpus() -> int | None:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


if __name__ == "__main__":
    main()
