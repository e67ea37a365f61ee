"""The Python API, mirroring the CLI: ``profile``, ``solve``, ``verify``.

Example:
    >>> plan = ckptplan.solve("sample_models/gpt.py", budget="60%")   # doctest: +SKIP
    >>> model = ckptplan.apply(build_model(), plan)                    # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ckptplan.budget import format_budget_at_least, format_bytes, parse_budget
from ckptplan.callerstate import keeps_random_state
from ckptplan.devices import get_device
from ckptplan.distributed import per_rank
from ckptplan.errors import BelowLeastPeak, CkptplanError, option
from ckptplan.hub import HubModel, is_hub_name
from ckptplan.loading import Inputs, LiveModel, Workload, load_model_file
from ckptplan.measure import Verification, compiled_fake_run, fake_run_peak, verify_plan
from ckptplan.opgraph import GapReport, optimality_gap
from ckptplan.options import precision, renamed_keywords
from ckptplan.plan import Plan, Region, as_plan
from ckptplan.problem import region_policy, selective_menus, to_chain
from ckptplan.profiler import Profile, Settings, profile_model
from ckptplan.progress import QUIET, Progress
from ckptplan.scaleout import sharding_advice
from ckptplan.simulate import predict
from ckptplan.solvers import BASELINES, SOLVERS, run_solver
from ckptplan.solvers.chain import Chain, InfeasibleBudget, Schedule
from ckptplan.solvers.selective import Selection
from ckptplan.training import dtype_name, optimizer_name

ModelArg = torch.nn.Module | str | Path | HubModel
"""A model object (with its example inputs), a model file, ``hf:NAME_OR_DIR``, or a
``HubModel`` (``hf:`` with its task and input sizes)."""

FAKE_RUN_TRIES = 4
RELAX_TRIES = 6
"""Solves whose plan the fake run checks; each retry takes the overshoot (doubled each time)
off the solver's target."""


def load_workload(model: str | Path | HubModel) -> Workload:
    """The workload a model file or ``hf:`` name stands for (as the commands take them)."""
    return _workload(model, None, None)


def _workload(
    model: ModelArg,
    example_inputs: Inputs | None,
    loss_fn: Callable[[Any], torch.Tensor] | None,
) -> Workload:
    if isinstance(model, torch.nn.Module):
        if example_inputs is None:
            raise CkptplanError("pass example_inputs (the args or kwargs of forward) with a model")
        return LiveModel(model, example_inputs, loss_fn)
    if isinstance(model, HubModel):
        return model
    if is_hub_name(model):
        return HubModel.parse(str(model))
    return load_model_file(model)


OptimizerArg = str | type[torch.optim.Optimizer]
"""A shortcut (adamw, adam, sgd, none), an optimizer class, or a class's dotted path."""
DtypeArg = str | torch.dtype


def _settings(
    batch_size: int | None,
    optimizer: OptimizerArg,
    dtype: DtypeArg,
    target: str,
    blocks: str | None,
    autocast: DtypeArg | None,
    measure: bool,
    compiled: bool = False,
) -> Settings:
    """The settings a plan records, torch's own types written as their names, and mixed
    precision (``bf16-mixed``) as the fp32 weights and the autocast dtype it stands for."""
    try:
        weights, half = precision(
            dtype_name(dtype), None if autocast is None else dtype_name(autocast)
        )
    except ValueError as exc:
        raise CkptplanError(str(exc)) from None
    return Settings(
        batch_size=batch_size,
        optimizer=optimizer_name(optimizer),
        dtype=weights,
        device=target,
        blocks=blocks,
        autocast=half,
        measure=measure,
        compiled=compiled,
    )


@keeps_random_state
@renamed_keywords(device="target")
def profile(
    model: ModelArg,
    example_inputs: Inputs | None = None,
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    batch_size: int | None = None,
    optimizer: OptimizerArg = "adamw",
    dtype: DtypeArg = "fp32",
    autocast: DtypeArg | None = None,
    target: str = "cpu",
    blocks: str | None = None,
    measure: bool = False,
    world_size: int = 1,
    parallel: str | None = None,
    progress: Progress = QUIET,
) -> Profile:
    """Profile one training step on fake tensors (nothing is allocated), priced for the
    ``target`` device.

    ``measure=True`` also runs the step for real on this machine and times every op. With
    ``parallel`` ("fsdp" or "ddp") and ``world_size``, the profile is one rank's.
    """
    workload = _workload(model, example_inputs, loss_fn)
    settings = _settings(batch_size, optimizer, dtype, target, blocks, autocast, measure)
    progress.phase(_profiling(settings))
    return _per_rank(profile_model(workload, settings), world_size, parallel)


def _profiling(settings: Settings) -> str:
    """The profiling phase, as a progress display names it."""
    if settings.measure:
        return "profiling one training step on fake tensors, then timing its ops for real"
    return "profiling one training step on fake tensors"


@keeps_random_state
@renamed_keywords(device="target")
def solve(
    model: ModelArg,
    example_inputs: Inputs | None = None,
    *,
    budget: str | int,
    solver: str = "auto",
    scope: str = "step",
    every: int = 2,
    max_segment: int | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    batch_size: int | None = None,
    optimizer: OptimizerArg = "adamw",
    dtype: DtypeArg = "fp32",
    autocast: DtypeArg | None = None,
    target: str = "cpu",
    blocks: str | None = None,
    measure: bool = False,
    fake_run: bool = True,
    world_size: int = 1,
    parallel: str | None = None,
    margin: float | None = None,
    compiled: bool = False,
    progress: Progress = QUIET,
) -> Plan:
    """Profile the model and return the plan of least recompute time that fits ``budget`` on
    the ``target`` device, less ``margin`` percent of it (default: the target's, 0.1 on the
    CPU, 3 on a GPU).

    With ``fake_run`` (the default) the chosen plan is executed on fake tensors to confirm
    its peak; should the real checkpointed code need more than the chain model predicted,
    the solver is asked again with the difference taken off the budget.

    With ``parallel`` ("fsdp" or "ddp") and ``world_size`` the budget, the profile and the plan
    are one rank's (``batch_size`` is the per-rank batch); the fake run, which executes one
    unsharded device, is skipped.

    With ``compiled``, the plan is for ``apply`` then ``torch.compile``: the step is priced
    fused, and the fake run compiles it, so the budget holds the partition AOTAutograd makes
    (a percentage is of the compiled unchecked step's peak); the plan records that partition.
    """
    if solver not in SOLVERS:
        raise CkptplanError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    parsed = parse_budget(str(budget))
    workload = _workload(model, example_inputs, loss_fn)
    settings = _settings(batch_size, optimizer, dtype, target, blocks, autocast, measure, compiled)
    progress.phase(_profiling(settings))
    whole = profile_model(workload, settings)
    prof = _per_rank(whole, world_size, parallel)
    progress.phase(f"solving ({solver})")
    menus = selective_menus(prof) if solver == "auto" else None
    chain = to_chain(prof, scope, menus)
    options = {"every": every, "max_segment": max_segment}
    unchecked = run_solver("none", chain, None, **options)
    checked = fake_run and parallel is None
    reference_peak = unchecked.peak
    if compiled and checked:
        progress.phase("compiling the unchecked step on fake tensors")
        reference_peak = fake_run_peak(
            workload, plan_from_schedule(prof, chain, unchecked, parsed.text, 0, scope)
        )
    budget_bytes = parsed.resolve(reference_peak)
    # A fixed policy is the plan the user named: only the searching solvers hold a margin back.
    held_back = _margin(margin, target, compiled) if solver in ("dp", "auto") else 0.0
    aim = budget_bytes - round(budget_bytes * held_back / 100)
    baselines = {}
    for name in BASELINES:
        base = run_solver(name, chain, None, **options)
        baselines[base.solver] = predict(prof, chain, base, scope).to_json()
    search = _Search(
        prof=prof,
        chain=chain,
        menus=menus,
        workload=workload,
        options=options,
        budget_text=parsed.text,
        budget_bytes=budget_bytes,
        aim=aim,
        scope=scope,
        margin=held_back,
        settings={"world_size": world_size, "parallel": parallel},
        baselines=baselines,
        checked=checked,
        progress=progress,
    )
    try:
        plan, confirmed = _searched(search, solver, target, compiled)
    except BelowLeastPeak as exc:
        if scope != "step":  # a budget for activations alone: sharding does not change them
            raise
        advice = sharding_advice(whole, aim, scope, world_size)
        raise BelowLeastPeak(f"{exc}{advice}", exc.least_bytes) from None
    if plan is not None:
        return plan
    raise CkptplanError(
        f"the checkpointed step, run on fake tensors, needs {format_bytes(confirmed)}, over "
        f"the {format_bytes(aim)} the budget {format_bytes(budget_bytes)} leaves with every "
        f"plan {solver} found for it; use "
        f"{option('budget', format_budget_at_least(_admitting(confirmed, held_back)))} or more"
    )


def _searched(search: _Search, solver: str, target: str, compiled: bool) -> tuple[Plan | None, int]:
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
                plan.predicted["recompute_time_s"],
                segments.predicted["recompute_time_s"],
                plan.predicted["step_time_s"],
                get_device(target, compiled).selective_margin if _policied(plan) else 0.0,
            )
        ):
            plan, confirmed = replace(segments, solver="auto"), segments_peak
    return plan, confirmed


@dataclass(frozen=True)
class _Search:
    """One solve's problem and budget: solver runs, each plan confirmed by a fake run."""

    prof: Profile
    chain: Chain
    menus: list[list[Selection]] | None
    workload: Workload
    options: dict[str, Any]
    budget_text: str
    budget_bytes: int
    aim: int
    scope: str
    margin: float
    settings: dict[str, Any]
    baselines: dict[str, Any]
    checked: bool
    progress: Progress = QUIET
    confirmed: dict[str, int] = field(default_factory=dict)
    """Fake-run peaks by the plan's regions: auto and dp often reach the same plan."""
    partitions: dict[str, dict[str, Any]] = field(default_factory=dict)
    """For a compiled step, the partition each fake run made, by the plan's regions."""

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
            confirmed = self._fake_run(plan)
            plan.predicted["fake_run_peak_bytes"] = confirmed
            if confirmed <= self.aim:
                if solver in ("dp", "auto") and self.prof.settings.compiled:
                    return self._relaxed(solver, target, plan, confirmed)
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
            looser = self._plan(self._schedule(solver, trial))
            peak = self._fake_run(looser)
            looser.predicted["fake_run_peak_bytes"] = peak
            if peak > self.aim:
                high = trial
                continue
            low, room = trial, max(room, self.aim - peak)
            if looser.predicted["recompute_time_s"] < plan.predicted["recompute_time_s"]:
                plan, confirmed = looser, peak
        return plan, confirmed

    def _fake_run(self, plan: Plan) -> int:
        key = json.dumps([region.to_json() for region in plan.regions])
        if key not in self.confirmed:
            self.progress.phase("confirming the plan's peak on fake tensors")
            if self.prof.settings.compiled:
                peak, partition = compiled_fake_run(self.workload, plan)
                self.partitions[key] = partition.to_json()
            else:
                peak = fake_run_peak(self.workload, plan)
            self.confirmed[key] = peak
        if key in self.partitions:
            plan.predicted["compiled_partition"] = self.partitions[key]
        return self.confirmed[key]

    def _schedule(self, solver: str, target: int) -> Schedule:
        """The solver's schedule for ``target``, or below its least peak the schedule of least
        peak, when its fake run (kept in ``confirmed``) fits the aim."""
        try:
            return run_solver(solver, self.chain, target, **self.options)
        except InfeasibleBudget as exc:
            refusal = (self.budget_bytes, self.prof, solver, self.scope, self.margin)
            if not self.checked:
                raise _below_least_peak(exc.least_peak, *refusal) from None
            # The chain model keeps a saved tensor until its backward node ends; a checkpoint's
            # recomputed copy dies at its last use inside the node. So the plan of least peak
            # may run within a budget its prediction exceeds: the fake run decides.
            schedule = run_solver(solver, self.chain, exc.least_peak, **self.options)
            confirmed = self._fake_run(self._plan(schedule))
            if confirmed > self.aim:
                raise _below_least_peak(confirmed, *refusal) from None
            return schedule

    def _plan(self, schedule: Schedule) -> Plan:
        plan = plan_from_schedule(
            self.prof,
            self.chain,
            schedule,
            self.budget_text,
            self.budget_bytes,
            self.scope,
            self.menus,
        )
        plan = replace(
            plan,
            budget={**plan.budget, "margin_percent": self.margin, "aim_bytes": self.aim},
            settings={**plan.settings, **self.settings},
        )
        plan.baselines.update(self.baselines)
        return plan


# Note [why selective plans must win by a margin]
#     A selective plan's saving is the recompute time of the op outputs it keeps; what it pays
#     is host time in the policy's dispatch modes, per op call, which ``--measure`` found to be
#     30-200 µs per call on the sample models, step to step and model to model. Measured on the
#     CPU against the segments-only plan for the same budget, selective plans predicted 1-3% of
#     the step cheaper ran 1-7% slower (ViT, GPT), and two runs of one plan differ by about 2%
#     in time ratio. So on the CPU a predicted gain below 3% of the step is no gain
#     (``Device.selective_margin``).


def selective_pays(selective: float, segments: float, step: float, margin: float) -> bool:
    """Whether a plan of ``selective`` seconds of recompute (an auto plan) is to be taken over
    the segments-only plan of ``segments`` seconds for the same budget: by more than ``margin``
    of the ``step`` where it runs selective policies (0 where it runs none)."""
    return segments - selective > margin * step


def _policied(plan: Plan) -> bool:
    return any(r.policy or any(c.policy for c in r.children) for r in plan.regions)


def _margin(percent: float | None, target: str, compiled: bool = False) -> float:
    """The share of the budget held back, in percent (the target's default when None)."""
    if percent is None:
        return get_device(target, compiled).margin_percent
    if not 0 <= percent < 50:
        example = option("margin", 2)
        raise CkptplanError(
            f"{option('margin', percent)} is not a percentage in [0, 50); e.g. {example}"
        )
    return percent


def _admitting(peak: int, margin: float) -> int:
    """The least budget whose share outside the margin holds ``peak``."""
    return math.ceil(peak / (1 - margin / 100))


def _below_least_peak(
    least: int, budget: int, prof: Profile, solver: str, scope: str, margin: float
) -> BelowLeastPeak:
    held = f" less its {margin:g}% margin" if margin else ""
    return BelowLeastPeak(
        f"budget {format_bytes(budget)}{held} is below the least feasible peak "
        f"{format_bytes(least)} of {prof.model_name} with solver {solver} (scope {scope}); "
        f"use {option('budget', format_budget_at_least(_admitting(least, margin)))} or more",
        least,
    )


@keeps_random_state
@renamed_keywords(device="target")
def optimality_gap_of_auto(
    model: ModelArg,
    example_inputs: Inputs | None = None,
    *,
    budget: str | int,
    time_limit_s: float = 60.0,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    batch_size: int | None = None,
    optimizer: OptimizerArg = "adamw",
    dtype: DtypeArg = "fp32",
    autocast: DtypeArg | None = None,
    target: str = "cpu",
    blocks: str | None = None,
    measure: bool = False,
) -> GapReport:
    """Auto's plan for an activations ``budget`` against the exact op-graph optimum (the
    ``ilp`` solver) at the same peak: see ``ckptplan.opgraph``."""
    prof = profile(
        model,
        example_inputs,
        loss_fn=loss_fn,
        batch_size=batch_size,
        optimizer=optimizer,
        dtype=dtype,
        autocast=autocast,
        target=target,
        blocks=blocks,
        measure=measure,
    )
    menus = selective_menus(prof)
    chain = to_chain(prof, "activations", menus)
    unchecked = run_solver("none", chain, None)
    budget_bytes = parse_budget(str(budget)).resolve(unchecked.peak)
    try:
        schedule = run_solver("auto", chain, budget_bytes)
    except InfeasibleBudget as exc:
        refusal = (budget_bytes, prof, "auto", "activations", 0.0)
        raise _below_least_peak(exc.least_peak, *refusal) from None
    return optimality_gap(prof, chain, schedule, time_limit_s, menus=menus)


def _per_rank(prof: Profile, world_size: int, parallel: str | None) -> Profile:
    """One rank's profile under data parallelism; the profile itself on one device."""
    if parallel is None:
        if world_size != 1:
            raise CkptplanError(
                f"{option('world_size', world_size)} needs {option('parallel', 'fsdp')} or "
                f"{option('parallel', 'ddp')}: how the ranks hold the model"
            )
        return prof
    return per_rank(prof, world_size, parallel)


def plan_from_schedule(
    prof: Profile,
    chain: Chain,
    schedule: Schedule,
    budget_text: str,
    budget_bytes: int,
    scope: str = "step",
    menus: list[list[Selection]] | None = None,
) -> Plan:
    """The plan file for a solver's schedule of ``prof``'s chain (``menus`` name the ops kept
    by the schedule's selective options).
    """
    chosen = {block: menus[block][option] for block, option in schedule.options} if menus else {}
    offloaded = sum(selection.offloaded_bytes for selection in chosen.values())
    return Plan(
        model=prof.model_name,
        fingerprint=prof.fingerprint,
        inputs=prof.inputs,
        budget={"text": budget_text, "bytes": budget_bytes, "scope": scope},
        solver=schedule.solver,
        settings={**asdict(prof.settings), "scope": scope, "notes": list(prof.notes)},
        blocks=tuple(b.path for b in prof.blocks),
        regions=_regions(prof, chain, schedule, chosen),
        predicted=predict(prof, chain, schedule, scope, offloaded).to_json(),
        baselines={},
    )


def _regions(
    prof: Profile, chain: Chain, schedule: Schedule, chosen: dict[int, Selection]
) -> tuple[Region, ...]:
    """The schedule's regions in execution order: its segments, and its nested enclosures
    (the module whole, each of its blocks a region inside)."""
    paths = [b.path for b in prof.blocks]
    regions = [
        (start, Region(tuple(paths[start:end]), policy=region_policy(prof, start, end, chosen)))
        for start, end in schedule.segments
    ]
    for index in schedule.nested:
        enclosure = chain.enclosures[index]
        inner = tuple(Region((p,)) for p in paths[enclosure.start : enclosure.end])
        regions.append((enclosure.start, Region((enclosure.name,), children=inner)))
    return tuple(region for _, region in sorted(regions, key=lambda r: r[0]))


@keeps_random_state
@renamed_keywords(device="run_on")
def verify(
    model: ModelArg,
    plan: Plan | str | Path,
    example_inputs: Inputs | None = None,
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    run_on: str | None = None,
    repeats: int = 3,
    force: bool = False,
    progress: Progress = QUIET,
) -> Verification:
    """Run the step with and without the plan on the local device ``run_on`` (default CUDA
    where present): measured peak, time ratio, gradient difference."""
    workload = _workload(model, example_inputs, loss_fn)
    the_plan = as_plan(plan)
    if the_plan.settings.get("parallel"):
        ranks, mode = the_plan.settings.get("world_size"), the_plan.settings["parallel"]
        raise CkptplanError(
            f"the plan is per rank ({ranks} ranks, {mode}); verify it where it runs: torchrun "
            f"--nproc_per_node {ranks} examples/train_{mode}.py PLAN --report DIR"
        )
    if isinstance(workload, LiveModel) and the_plan.settings.get("batch_size") is not None:
        the_plan = Plan.from_json(
            {**the_plan.to_json(), "settings": {**the_plan.settings, "batch_size": None}}
        )
    progress.phase(f"measuring the step with and without the plan (--repeats {repeats})")
    return verify_plan(workload, the_plan, device=run_on, repeats=repeats, force=force)
