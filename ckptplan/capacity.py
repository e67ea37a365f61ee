"""How much can I train: the largest batch (or sequence length) whose best plan fits a budget.

``fit`` asks ``solve`` at one size after another: doubling from 1 until a size is refused (its
least feasible peak is over the budget), then halving the interval between the largest size
that fits and the smallest refused. The search asks the chain model alone; the answer and the
size after it are then solved again with the fake run that ``solve`` confirms a plan with, so
the answer is exact: solved at that size, refused at the next. Each size is profiled anew on
fake tensors, so nothing assumes that activations grow linearly with the batch. The least
feasible peak never falls as the size grows (a larger batch makes every tensor of the step at
least as large), so the search needs one refusal to stop.

Among the sizes that fit, the recommended one has the best predicted throughput (samples, or
tokens for ``vary="seq-len"``, per second, recompute counted), which is not always the largest:
the recompute a tight budget forces can cost more than the larger size gains.

Example:
    >>> result = fit("model.py", budget="12GB")        # doctest: +SKIP
    >>> result.largest, result.recommended              # doctest: +SKIP
    (48, 40)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ckptplan.api import load_workload, solve_with
from ckptplan.deprecation import old_spellings
from ckptplan.errors import BelowLeastPeak, CkptplanError, option
from ckptplan.hub import HubModel
from ckptplan.options import (
    Autocast,
    DType,
    Optimizer,
    Parallel,
    ProfileOptions,
    Scope,
    SolveOptions,
    Strategy,
    Target,
    options_from,
)
from ckptplan.progress import QUIET, Progress
from ckptplan.solvers import SolverName
from ckptplan.values.budget import Budget, format_bytes, parse_budget
from ckptplan.values.plan import Plan

VARY = ("batch", "seq-len")


@dataclass(frozen=True)
class FitPoint:
    """One size asked of ``solve``: its plan, or the least feasible peak that refused it."""

    size: int
    fits: bool
    peak_bytes: int
    """The plan's predicted peak when it fits; else the least feasible peak at this size."""
    plan: Plan | None = None
    throughput: float | None = None
    """Predicted samples (tokens, for ``seq-len``) per second, recompute included."""
    refusal: str = ""
    """Why ``solve`` refused this size, where it did."""

    @property
    def overhead(self) -> float | None:
        return None if self.plan is None else self.plan.predicted.overhead

    @property
    def regions(self) -> str:
        """The plan in brief: how many of the blocks its regions cover, and how."""
        if self.plan is None:
            return ""
        regions = self.plan.regions
        if not regions:
            return "no checkpointing"
        covered = sum(len(r.modules) for r in regions)
        count = f"{len(regions)} region{'s' if len(regions) > 1 else ''}"
        text = f"{count} over {covered} of {len(self.plan.blocks)} blocks"
        selective = [r for r in regions if r.policy is not None]
        if selective:
            text += f", {len(selective)} selective"
        if any(r.policy is not None and r.policy.offloads for r in regions):
            text += ", offloading"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "fits": self.fits,
            "peak_bytes": self.peak_bytes,
            "predicted_overhead": self.overhead,
            "throughput": self.throughput,
            "regions": self.regions,
        }


@dataclass(frozen=True)
class Fit:
    """The sizes ``fit`` asked, in increasing order, and its answer."""

    vary: str
    budget_bytes: int
    points: tuple[FitPoint, ...]
    largest: int
    """The largest size that fits (``fit`` refuses a budget that not even size 1 fits)."""
    recommended: int
    """The fitting size of best predicted throughput."""
    reason: str

    def plan_for(self, size: int) -> Plan | None:
        return next((p.plan for p in self.points if p.size == size), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "vary": self.vary,
            "budget_bytes": self.budget_bytes,
            "largest": self.largest,
            "recommended": self.recommended,
            "reason": self.reason,
            "points": [p.to_json() for p in self.points],
        }


@old_spellings(device="target")
def fit(
    model: str | Path | HubModel,
    *,
    budget: str | int,
    vary: str = "batch",
    max_size: int = 4096,
    solver: SolverName = "auto",
    scope: Scope = "step",
    margin: float | None = None,
    fake_run: bool = True,
    offload: bool = True,
    every: int = 2,
    max_segment: int | None = None,
    batch_size: int | None = None,
    optimizer: Optimizer | str | type[torch.optim.Optimizer] = "adamw",
    dtype: DType | torch.dtype = "fp32",
    autocast: Autocast | torch.dtype | None = None,
    target: Target = "cpu",
    blocks: str | None = None,
    measure: bool = False,
    compiled: bool = False,
    world_size: int = 1,
    strategy: Strategy | None = None,
    progress: Progress = QUIET,
) -> Fit:
    """The largest ``vary`` size (the batch, or an ``hf:`` model's sequence length) whose best
    plan fits ``budget`` (an absolute size: a percentage would change with the size), up to
    ``max_size``, and the fitting size of best predicted throughput. The other options are
    ``ckptplan.solve``'s (``batch_size`` only with ``vary="seq-len"``); ``fake_run`` confirms
    the answer and the size after it."""
    step, search, ranks = options_from(locals())
    return fit_with(model, parse_budget(str(budget)), vary, max_size, step, search, ranks, progress)


def fit_with(
    model: str | Path | HubModel,
    budget: Budget,
    vary: str,
    max_size: int,
    step: ProfileOptions,
    search: SolveOptions,
    ranks: Parallel,
    progress: Progress = QUIET,
) -> Fit:
    """``fit`` with its options as objects (the CLI's)."""
    if vary not in VARY:
        raise CkptplanError(f"{option('vary', vary)}: choose one of {', '.join(VARY)}")
    parsed = budget
    if parsed.bytes is None:
        raise CkptplanError(
            f"budget {parsed.text!r} is a share of the unchecked step, which grows with the "
            f"size; give fit the memory itself, e.g. {option('budget', '12GB')}"
        )
    workload = load_workload(model)
    if vary == "seq-len" and not isinstance(workload, HubModel):
        raise CkptplanError(
            f"{option('vary', 'seq-len')} needs an hf: model, whose inputs ckptplan makes; a "
            "model file's example_inputs set their own sequence length"
        )
    if vary == "seq-len":
        assert isinstance(workload, HubModel)
        step = replace(step, batch_size=step.batch_size or 1)
        max_size = min(max_size, workload.position_limit or max_size)

    confirming = search
    searching = replace(confirming, fake_run=False)

    def ask(size: int, search: SolveOptions = searching) -> FitPoint:
        progress.phase(f"solving at {vary} {size}")
        sized = workload
        options = step
        if vary == "seq-len":
            assert isinstance(workload, HubModel)
            sized = replace(workload, seq_len=size)
        else:
            options = replace(step, batch_size=size)
        try:
            plan = solve_with(sized, parsed, options, search, ranks)
        except BelowLeastPeak as refused:
            return FitPoint(size, False, refused.least_bytes, refusal=str(refused))
        items = size * (step.batch_size or 1) if vary == "seq-len" else size
        seconds = plan.predicted.step_time_s + plan.predicted.recompute_time_s
        throughput = items / seconds if seconds > 0 else None
        return FitPoint(size, True, plan.predicted.peak_bytes, plan, throughput)

    points = _confirmed(_search(ask, max_size), lambda size: ask(size, confirming), max_size)
    return _answer(vary, parsed.bytes, points)


def _confirmed(
    points: tuple[FitPoint, ...], confirm: Callable[[int], FitPoint], max_size: int
) -> tuple[FitPoint, ...]:
    """The search's answer asked again with the fake run, at that size and the next, moved
    down (or up) a size at a time where the fake run disagrees with the chain model."""
    asked = {p.size: p for p in points}
    largest = max((p.size for p in points if p.fits), default=0)
    while largest >= 1:
        asked[largest] = confirm(largest)
        if asked[largest].fits:
            break
        largest -= 1
    while largest < max_size:
        asked[largest + 1] = confirm(largest + 1)
        if not asked[largest + 1].fits:
            break
        largest += 1
    return tuple(asked[s] for s in sorted(asked))


def _search(ask: Callable[[int], FitPoint], max_size: int) -> tuple[FitPoint, ...]:
    """Double from 1 until a size is refused (or ``max_size``), then bisect: every size asked,
    in increasing order."""
    asked: dict[int, FitPoint] = {}
    low, high, size = 0, None, 1
    while size <= max_size:
        asked[size] = ask(size)
        if not asked[size].fits:
            high = size
            break
        low, size = size, 2 * size
    if high is None and low < max_size:
        asked[max_size] = ask(max_size)
        low, high = (max_size, None) if asked[max_size].fits else (low, max_size)
    while high is not None and high - low > 1:
        middle = (low + high) // 2
        asked[middle] = ask(middle)
        low, high = (middle, high) if asked[middle].fits else (low, middle)
    return tuple(asked[s] for s in sorted(asked))


def _answer(vary: str, budget_bytes: int, points: tuple[FitPoint, ...]) -> Fit:
    fitting = [p for p in points if p.fits]
    if not fitting:
        least = points[0]
        raise BelowLeastPeak(
            f"even {vary} {least.size} is refused: {least.refusal}", least.peak_bytes
        )
    largest = fitting[-1]
    best = max(fitting, key=lambda p: (p.throughput or 0.0, p.size))
    refused = next((p for p in points if not p.fits and p.size > largest.size), None)
    limit = (
        f"{vary} {refused.size} needs {format_bytes(refused.peak_bytes)} at least"
        if refused is not None
        else "no larger size asked: --max-size, or the model's positions"
    )
    if best is largest:
        reason = f"{vary} {largest.size} is the largest that fits ({limit}) and the fastest"
    else:
        gain = (best.throughput or 0.0) / (largest.throughput or 1.0) - 1
        why = (
            f"its recompute costs +{best.overhead or 0:.0%} of a step against "
            f"+{largest.overhead or 0:.0%}"
            if (best.overhead or 0) < (largest.overhead or 0)
            else "the step's time grows faster than its size beyond it"
        )
        reason = (
            f"{vary} {best.size} is predicted {gain:.0%} faster than the largest, "
            f"{largest.size} ({limit}): {why}"
        )
    return Fit(vary, budget_bytes, points, largest.size, best.size, reason)
