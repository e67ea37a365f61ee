"""A candidate step measured against the unchecked baseline on the local device: gradients,
steady-state peak (``ckptplan.stepping.steppeak``) and paired step times
(``ckptplan.verifying.pairtiming``)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import torch

from ckptplan.loading import Workload
from ckptplan.profiling.training import make_optimizer
from ckptplan.stepping.steppeak import StepRun, measured_peak, tracked_peak
from ckptplan.values.plan import PlanSettings
from ckptplan.verifying.gradcompare import max_grad_abs_diff
from ckptplan.verifying.pairtiming import pair_ratios, paired_times


@dataclass(frozen=True)
class Comparison:
    """What one candidate measured beside the baseline, before it is held to a plan."""

    measured_peak_bytes: int
    baseline_peak_bytes: int
    step_time_s: float
    baseline_step_time_s: float
    max_grad_abs_diff: float
    step_time_ratio: float
    """Median over the timed pairs of candidate / baseline step time."""
    step_time_ratio_range: tuple[float, float]
    tracked_peak_bytes: int | None = None
    """The candidate's peak by the profiler's live-storage tracker (CPU only)."""
    reserved_peak_bytes: int | None = None
    """The candidate's peak reserved by CUDA's caching allocator (CUDA only)."""


def compare(
    model_file: Workload,
    settings: PlanSettings,
    baseline_model: torch.nn.Module,
    candidate: torch.nn.Module,
    inputs: Any,
    target: torch.device,
    repeats: int,
    track: bool = True,
) -> Comparison:
    """Gradients, steady-state peak and median step time of ``candidate`` against the baseline
    (and on the CPU with ``track``, its peak by the live-storage tracker too)."""
    autocast = settings.autocast
    max_diff = max_grad_abs_diff(model_file, baseline_model, candidate, inputs, autocast)
    optimizer_name = settings.optimizer
    runs = {
        name: StepRun(model, make_optimizer(optimizer_name, model), inputs, autocast)
        for name, model in (("baseline", baseline_model), ("candidate", candidate))
    }
    scope = settings.scope
    peaks = {name: measured_peak(model_file, run, target, scope) for name, run in runs.items()}
    tracked = (
        tracked_peak(model_file, runs["candidate"], scope)
        if target.type == "cpu" and track
        else None
    )
    times = paired_times(model_file, runs, target, repeats)
    ratios = pair_ratios(times)
    return Comparison(
        measured_peak_bytes=peaks["candidate"][0],
        baseline_peak_bytes=peaks["baseline"][0],
        tracked_peak_bytes=tracked,
        reserved_peak_bytes=peaks["candidate"][1],
        step_time_s=statistics.median(times["candidate"]),
        baseline_step_time_s=statistics.median(times["baseline"]),
        max_grad_abs_diff=max_diff,
        step_time_ratio=statistics.median(ratios),
        step_time_ratio_range=(min(ratios), max(ratios)),
    )
