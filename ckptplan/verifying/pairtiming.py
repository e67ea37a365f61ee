"""Step times taken in pairs: the candidate's step and the baseline's back to back, in
alternating order. A ratio is then the median of the pairs' ratios, so a burst of load on a
shared machine spoils one pair, not the comparison."""

from __future__ import annotations

import copy
import time

import torch

from ckptplan.applying.install import apply
from ckptplan.errors import CkptplanError
from ckptplan.loading import Workload
from ckptplan.profiling.training import make_optimizer
from ckptplan.stepping.steppeak import StepRun, train_step
from ckptplan.values.plan import Plan
from ckptplan.verifying.localrun import baseline_run


def check_repeats(repeats: int) -> None:
    """Refuse a timing of no steps in one line, before any model is built."""
    if repeats < 1:
        raise CkptplanError(f"{repeats} repeats: time at least one step of each (e.g. 3)")


def timed_step(model_file: Workload, run: StepRun, device: torch.device) -> float:
    """Seconds of one training step, the device synchronised on both sides."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    train_step(model_file, run, seed=3)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def paired_times(
    model_file: Workload, runs: dict[str, StepRun], target: torch.device, repeats: int
) -> dict[str, list[float]]:
    """Step times of ``runs`` in ``repeats`` back-to-back rounds, the order alternating."""
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeats):
        for name in names if i % 2 == 0 else reversed(names):
            times[name].append(timed_step(model_file, runs[name], target))
    return times


def pair_ratios(times: dict[str, list[float]]) -> list[float]:
    """Candidate / baseline step time of each back-to-back pair."""
    return [c / b for c, b in zip(times["candidate"], times["baseline"], strict=True)]


def interleaved_step_times(
    model_file: Workload, plans: dict[str, Plan], repeats: int = 9
) -> dict[str, list[float]]:
    """Step times of the model under each of ``plans`` (made for the same model and batch) on
    this CPU, in ``repeats`` interleaved rounds, so that two plans are compared in one process
    under the same conditions (``benchmarks/auto_vs_dp.py``); round ``i``'s times are pairs."""
    check_repeats(repeats)
    target = torch.device("cpu")
    settings = next(iter(plans.values())).settings
    baseline_model, inputs, _ = baseline_run(model_file, settings, target)
    optimizer = settings.optimizer
    runs = {}
    for name, plan in plans.items():
        model = apply(copy.deepcopy(baseline_model), plan)
        runs[name] = StepRun(model, make_optimizer(optimizer, model), inputs, settings.autocast)
    for run in runs.values():  # warm-up: optimizer state, allocator pools
        timed_step(model_file, run, target)
    return paired_times(model_file, runs, target, repeats)
