"""The search for a budget's plan: solver runs at a target below the budget, each plan
confirmed by a fake run of the checkpointed step and the target lowered by what it overshot;
for ``auto``, the plan of segments where a selective plan does not pay for itself."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, replace
from typing import Any

from ckptplan.devices import Device, get_device
from ckptplan.errors import BelowLeastPeak
from ckptplan.loading import Workload
from ckptplan.options import Parallel
from ckptplan.planning.joined import fastest_fitting, joined_runs
from ckptplan.planning.problem import selective_menus, to_chain
from ckptplan.planning.schedule_plan import plan_from_schedule
from ckptplan.profiling.costs import eager_seconds
from ckptplan.progress import QUIET, Progress
from ckptplan.solvers import SolverOptions, run_solver
from ckptplan.solvers.chain import Chain, InfeasibleBudget, Schedule, simulate
from ckptplan.solvers.selective import Combination, Selection, combinations
from ckptplan.stepping.fakerun import compiled_fake_run, fake_run_peak
from ckptplan.values.budget import ResolvedBudget
from ckptplan.values.plan import Plan
from ckptplan.values.profile_types import Profile

UNCHECKED_FIGURES = ("seconds", "compiled_graphs", "graph_breaks")
"""What a compiled plan's partition records of the unchecked step's, beside its own."""
FAKE_RUN_TRIES = 4
RELAX_TRIES = 6
"""Solves whose plan the fake run checks; each retry takes the overshoot (doubled each time)
off the solver's target."""


def search_plan(search: Search, solver: str) -> tuple[Plan | None, int]:
    """The solver's plan (None if none fits) and its fake-run peak; for ``auto``, the plan of
    segments instead where a selective plan does not pay for itself."""
    plan, confirmed = search.run(solver)
    if solver == "auto":
        # Selective plans the fake run puts over, however low the target, or that do not pay
        # for themselves against the best of segments: the best of segments.
        try:
            segments, segments_peak = search.run("dp")
        except BelowLeastPeak:  # selective plans reach below the least peak of segments
            if plan is None:
                raise
            segments, segments_peak = None, 0
        if segments is not None and not (
            plan is not None
            and selective_pays(
                plan.predicted.recompute_time_s,
                segments.predicted.recompute_time_s,
                search.prof.step_time,
                search.device.selective_slack if _policied(plan) else 0.0,
            )
        ):
            plan, confirmed = replace(segments, solver="auto"), segments_peak
    return plan, confirmed


@dataclass(frozen=True)
class Search:
    """One solve's problem and budget: solver runs, each plan confirmed by a fake run."""

    prof: Profile
    chain: Chain
    menus: list[list[Selection]] | None
    workload: Workload
    options: SolverOptions
    budget: ResolvedBudget
    offload: bool
    """Whether selective policies may offload (``SolveOptions.offload``)."""
    ranks: Parallel
    baselines: dict[str, Any]
    checked: bool
    progress: Progress = QUIET
    confirmed: dict[str, int] = field(default_factory=dict)
    """Fake-run peaks by the plan's regions: auto and dp often reach the same plan."""
    partitions: dict[str, dict[str, Any]] = field(default_factory=dict)
    """For a compiled step, the partition each fake run made, by the plan's regions."""
    chain_times: dict[str, float] = field(default_factory=dict)
    """The chain's recompute time of each confirmed compiled plan, by its regions, which the
    joined search measures its combinations against; the plan predicts, and the search
    compares confirmed plans by, its partition's (Note [ranking compiled plans])."""

    @property
    def aim(self) -> int:
        return self.budget.aim

    def chain_time(self, plan: Plan) -> float:
        """``plan``'s recompute time as the chain prices it (a confirmed compiled plan predicts
        its partition's)."""
        return self.chain_times.get(_key(plan), plan.predicted.recompute_time_s)

    @functools.cached_property
    def eager_seconds(self) -> float:
        """The seconds of a compiled step that run eagerly outside its graphs (the optimizer
        step), unfused: the step a compiled plan's overhead is a fraction of includes them."""
        eager = replace(self.device, fused=False)
        return eager_seconds(self.prof.ops, eager, self.prof.settings.measure)

    @property
    def device(self) -> Device:
        return get_device(self.prof.settings.device, self.prof.settings.compiled)

    def run(self, solver: str) -> tuple[Plan | None, int]:
        """The plan of ``solver`` whose fake run fits the aim, or None with the last fake-run
        peak; each retry takes the overshoot (doubled each time) off the solver's target."""
        target = self.aim
        confirmed = 0
        for attempt in range(FAKE_RUN_TRIES):
            schedule = self._schedule(solver, target)
            plan = self._plan(schedule)
            if not self.checked:
                return plan, 0
            plan, confirmed = self._confirmed(plan)
            if confirmed <= self.aim:
                if solver in ("dp", "auto") and self.prof.settings.compiled:
                    plan, confirmed = self._relaxed(solver, target, plan, confirmed)
                if solver == "auto" and self.prof.settings.compiled:
                    return self._joined(plan, confirmed)
                return plan, confirmed
            if solver not in ("dp", "auto"):
                break
            target -= (confirmed - self.aim) * 2**attempt
        return None, confirmed

    def _relaxed(self, solver: str, target: int, plan: Plan, confirmed: int) -> tuple[Plan, int]:
        """A compiled step often keeps less than the chain model of the eager step says (the
        partitioner recomputes cheap ops outside regions too), so a fitting plan may leave room:
        the solver's target rises by that room until a plan overshoots, then bisects between
        the highest target that fit and the lowest that did not, keeping the plan that
        recomputes least. Fake runs are cached by regions, so a target that changes nothing
        costs nothing."""
        low, high, room = target, None, self.aim - confirmed
        for _ in range(RELAX_TRIES):
            if high is not None and high - low <= self.aim // 200:
                break
            trial = low + max(room, 1) if high is None else (low + high) // 2
            looser, peak = self._confirmed(self._plan(self._schedule(solver, trial)))
            if peak > self.aim:
                high = trial
                continue
            low, room = trial, max(room, self.aim - peak)
            if looser.predicted.recompute_time_s < plan.predicted.recompute_time_s:
                plan, confirmed = looser, peak
        return plan, confirmed

    def _joined(self, plan: Plan, confirmed: int) -> tuple[Plan, int]:
        """``plan``, or the fastest joined plan (``ckptplan.planning.joined``) whose fake run
        fits the aim, where its partition is predicted to recompute less: only the
        combinations of block options the chain prices faster than ``plan`` are searched."""
        menus = selective_menus(self.prof, joined=True, offload=self.offload)
        joined = replace(self, chain=to_chain(self.prof, self.budget.scope, menus), menus=menus)
        runs = joined_runs(joined.chain, menus)
        if not runs:
            return plan, confirmed
        blocks = [b for start, end in runs for b in range(start, end)]
        front = combinations([menus[b] for b in blocks])

        def joined_plan(point: Combination) -> Plan:
            return joined._joined_plan(runs, dict(zip(blocks, point.choice, strict=True)))

        # The chain prices a combination at its options' sum plus what it adds the same way
        # for every combination (the blocks outside runs, the segment's tail).
        constant = joined_plan(front[0]).predicted.recompute_time_s - front[0].recompute_time
        bound = self.chain_time(plan) - constant
        candidates = [point for point in front if point.recompute_time < bound]
        if not candidates:
            return plan, confirmed
        best = fastest_fitting(
            candidates, self.aim, lambda i: joined._fake_run(joined_plan(candidates[i]))
        )
        if best is None:
            return plan, confirmed
        found, peak = joined._confirmed(joined_plan(candidates[best]))
        if found.predicted.recompute_time_s < plan.predicted.recompute_time_s:
            return found, peak
        return plan, confirmed

    def _joined_plan(self, runs: list[tuple[int, int]], choice: dict[int, int]) -> Plan:
        """One region over each run with ``choice``'s options; every other block alone."""
        covered = {b for start, end in runs for b in range(start, end)}
        alone = [(b, b + 1) for b in range(len(self.chain.blocks)) if b not in covered]
        segments = sorted([*runs, *alone])
        return self._plan(simulate(self.chain, segments, "auto", sorted(choice.items())))

    def _fake_run(self, plan: Plan) -> int:
        key = _key(plan)
        if key not in self.confirmed:
            self.progress.phase("confirming the plan's peak on fake tensors")
            if self.prof.settings.compiled:
                peak, partition = compiled_fake_run(self.workload, plan)
                self.partitions[key] = partition.to_json()
            else:
                peak = fake_run_peak(self.workload, plan)
            self.confirmed[key] = peak
        return self.confirmed[key]

    def _confirmed(self, plan: Plan) -> tuple[Plan, int]:
        """The plan with its fake-run peak (and for a compiled step the partition its fake
        run made) in its prediction, and that peak."""
        peak = self._fake_run(plan)
        key = _key(plan)
        partition = self.partitions.get(key)
        predicted = replace(plan.predicted, fake_run_peak_bytes=peak)
        if partition is not None:
            self.chain_times[key] = plan.predicted.recompute_time_s
            unchecked_plan = replace(plan, regions=())
            self._fake_run(unchecked_plan)
            unchecked = self.partitions[_key(unchecked_plan)]
            predicted = replace(
                predicted,
                recompute_time_s=partition["seconds"] - unchecked["seconds"],
                step_time_s=unchecked["seconds"] + self.eager_seconds,
                compiled_partition={
                    **partition,
                    **{f"unchecked_{name}": unchecked[name] for name in UNCHECKED_FIGURES},
                },
            )
        return replace(plan, predicted=predicted), peak

    def _schedule(self, solver: str, target: int) -> Schedule:
        """The solver's schedule for ``target``, or below its least peak the schedule of least
        peak, when its fake run (kept in ``confirmed``) fits the aim."""
        try:
            return run_solver(solver, self.chain, target, self.options)
        except InfeasibleBudget as exc:
            of = f"{self.prof.model_name} with solver {solver} (scope {self.budget.scope})"
            if not self.checked:
                raise self.budget.below_least_peak(exc.least_peak, of) from None
            # The chain model keeps a saved tensor until its backward node ends; a checkpoint's
            # recomputed copy dies at its last use inside the node. So the plan of least peak
            # may run within a budget its prediction exceeds: the fake run decides.
            schedule = run_solver(solver, self.chain, exc.least_peak, self.options)
            confirmed = self._fake_run(self._plan(schedule))
            if confirmed > self.aim:
                raise self.budget.below_least_peak(confirmed, of) from None
            return schedule

    def _plan(self, schedule: Schedule) -> Plan:
        plan = plan_from_schedule(self.prof, self.chain, schedule, self.budget, self.menus)
        plan = replace(
            plan,
            settings=replace(
                plan.settings, world_size=self.ranks.world_size, parallel=self.ranks.strategy
            ),
        )
        plan.baselines.update(self.baselines)
        return plan


# Note [ranking compiled plans]
#     The chain prices a compiled plan's recompute op by op from the eager step's profile,
#     but the compiler recomputes cheap values outside regions too and runs a recomputed
#     pointwise op inside the backward kernel that reads it, so two plans the chain orders one
#     way can run the other (on HF ViT, 12x192 at 384px, the chain's plan at compile's 0.7
#     point is priced by its partition at +3.6%, the plan at its 0.5 point, of less memory, at
#     +1.8%). Every plan the search confirms has had its fake run, whose partition is priced
#     kernel by kernel (Note [pricing the partition] in ``ckptplan.stepping.graphcost``), so
#     confirmed compiled plans are compared by that price at no extra cost: the relaxed
#     targets' plans, the joined plan against the plan it would replace, auto against
#     segments. Which plans get confirmed is still the chain's choice (the solver's schedules,
#     the joined frontier): a fake run per candidate takes minutes on a large model.


# Note [why selective plans must win by a slack]
#     A selective plan's saving is the recompute time of the op outputs it keeps; what it pays
#     is host time in the policy's dispatch modes, per op call, which ``--measure`` found to be
#     30-200 µs per call on the sample models, step to step and model to model. Measured on the
#     CPU against the segments-only plan for the same budget, selective plans predicted 1-3% of
#     the step cheaper ran 1-7% slower (ViT, GPT), and two runs of one plan differ by about 2%
#     in time ratio. So on the CPU a predicted gain below 3% of the step is no gain
#     (``Device.selective_slack``).


def selective_pays(selective: float, segments: float, step: float, slack: float) -> bool:
    """Whether a plan of ``selective`` seconds of recompute (an auto plan) is to be taken over
    the segments-only plan of ``segments`` seconds for the same budget: by more than ``slack``
    of the ``step`` where it runs selective policies (0 where it runs none)."""
    return segments - selective > slack * step


def _key(plan: Plan) -> str:
    """A plan's regions, the key of what its fake run found."""
    return json.dumps([region.to_json() for region in plan.regions])


def _policied(plan: Plan) -> bool:
    return any(r.policy or any(c.policy for c in r.children) for r in plan.regions)
