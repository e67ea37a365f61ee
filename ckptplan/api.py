"""The Python API, mirroring the CLI: ``profile``, ``solve``, ``verify``.

Each takes its options as one object per concern (``ckptplan.options``): ``ProfileOptions``
for the step, ``SolveOptions`` for the search, ``Parallel`` for the ranks; or the same fields
as keywords, folded into them by name.

Example:
    >>> plan = ckptplan.solve("sample_models/gpt.py", budget="60%", solver="dp")  # doctest: +SKIP
    >>> plan = ckptplan.solve(
    ...     "sample_models/gpt.py",
    ...     budget="12GB",
    ...     profile_options=ProfileOptions(batch_size=8, target="h100"),
    ...     parallel=Parallel(world_size=8, strategy="fsdp"),
    ... )  # doctest: +SKIP
    >>> model = ckptplan.apply(build_model(), plan)  # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ckptplan.budget import admitting_budget, format_budget_at_least, format_bytes, parse_budget
from ckptplan.callerstate import keeps_random_state
from ckptplan.errors import BelowLeastPeak, CkptplanError, option
from ckptplan.hub import HubModel, is_hub_name
from ckptplan.loading import Inputs, LiveModel, Workload, load_model_file
from ckptplan.options import (
    Parallel,
    ProfileOptions,
    SolveOptions,
    fold_keywords,
    precision,
    refuse_unknown_keywords,
    renamed_keywords,
)
from ckptplan.plan import Plan, as_plan
from ckptplan.planning.distributed import per_rank
from ckptplan.planning.opgraph import GapReport, optimality_gap
from ckptplan.planning.problem import selective_menus, to_chain
from ckptplan.planning.scaleout import sharding_advice
from ckptplan.planning.schedule_plan import plan_from_schedule
from ckptplan.planning.search import Search, below_least_peak, held_back_percent, search_plan
from ckptplan.planning.simulate import predict
from ckptplan.profile_types import Profile, Settings
from ckptplan.profiling.profiler import profile_model
from ckptplan.profiling.training import dtype_name, optimizer_name
from ckptplan.progress import QUIET, Progress
from ckptplan.solvers import BASELINES, SOLVERS, run_solver
from ckptplan.solvers.chain import InfeasibleBudget
from ckptplan.verifying.fakerun import fake_run_peak
from ckptplan.verifying.verification import Verification, verify_plan

ModelArg = torch.nn.Module | str | Path | HubModel
"""A model object (with its example inputs), a model file, ``hf:NAME_OR_DIR``, or a
``HubModel`` (``hf:`` with its task and input sizes)."""


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


def settings_of(options: ProfileOptions) -> Settings:
    """The settings a plan records: torch's own types (a ``torch.dtype``, an optimizer class)
    written as their names, and mixed precision (``bf16-mixed``) as the fp32 weights and the
    autocast dtype it stands for."""
    autocast = options.autocast
    try:
        weights, half = precision(
            dtype_name(options.dtype), None if autocast is None else dtype_name(autocast)
        )
    except ValueError as exc:
        raise CkptplanError(str(exc)) from None
    return Settings(
        batch_size=options.batch_size,
        optimizer=optimizer_name(options.optimizer),
        dtype=weights,
        device=options.target,
        blocks=options.blocks,
        autocast=half,
        measure=options.measure,
        compiled=options.compiled,
    )


def options_of(
    function: str,
    keywords: dict[str, Any],
    profile_options: ProfileOptions | None,
    parallel: Parallel | str | None,
) -> tuple[ProfileOptions, Parallel]:
    """A call's profile options and ranks, with the keywords that name their fields folded in
    (Note [one field per option] in ``ckptplan.options``); ``parallel="fsdp"`` is the old
    spelling of ``strategy="fsdp"``."""
    if isinstance(parallel, str):
        warnings.warn(
            f"{function}(parallel={parallel!r}) is now strategy={parallel!r}",
            DeprecationWarning,
            stacklevel=3,
        )
        keywords.setdefault("strategy", parallel)
        parallel = None
    return (
        fold_keywords(profile_options or ProfileOptions(), keywords),
        fold_keywords(parallel or Parallel(), keywords),
    )


@keeps_random_state
@renamed_keywords(device="target")
def profile(
    model: ModelArg,
    example_inputs: Inputs | None = None,
    *,
    profile_options: ProfileOptions | None = None,
    parallel: Parallel | str | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    progress: Progress = QUIET,
    **keywords: Any,
) -> Profile:
    """Profile one training step on fake tensors (nothing is allocated), priced for the
    target device.

    ``measure=True`` also runs the step for real on this machine and times every op. With a
    ``Parallel`` strategy ("fsdp" or "ddp") and world size, the profile is one rank's.
    """
    step, ranks = options_of("profile", keywords, profile_options, parallel)
    refuse_unknown_keywords("profile", keywords)
    workload = _workload(model, example_inputs, loss_fn)
    settings = settings_of(step)
    progress.phase(_profiling(settings))
    return _per_rank(profile_model(workload, settings), ranks)


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
    solve_options: SolveOptions | None = None,
    profile_options: ProfileOptions | None = None,
    parallel: Parallel | str | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    progress: Progress = QUIET,
    **keywords: Any,
) -> Plan:
    """Profile the model and return the plan of least recompute time that fits ``budget`` on
    the target device, less the ``margin`` percent of it (default: the target's, 0.1 on the
    CPU, 3 on a GPU).

    With ``fake_run`` (the default) the chosen plan is executed on fake tensors to confirm
    its peak; should the real checkpointed code need more than the chain model predicted,
    the solver is asked again with the difference taken off the budget.

    With a ``Parallel`` strategy ("fsdp" or "ddp") and world size the budget, the profile and
    the plan are one rank's (``batch_size`` is the per-rank batch); the fake run, which
    executes one unsharded device, is skipped.

    With ``compiled``, the plan is for ``apply`` then ``torch.compile``: the step is priced
    fused, and the fake run compiles it, so the budget holds the partition AOTAutograd makes
    (a percentage is of the compiled unchecked step's peak); the plan records that partition.
    """
    step, ranks = options_of("solve", keywords, profile_options, parallel)
    search_options = fold_keywords(solve_options or SolveOptions(), keywords)
    refuse_unknown_keywords("solve", keywords)
    solver, scope = search_options.solver, search_options.scope
    if solver not in SOLVERS:
        raise CkptplanError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    parsed = parse_budget(str(budget))
    workload = _workload(model, example_inputs, loss_fn)
    settings = settings_of(step)
    progress.phase(_profiling(settings))
    whole = profile_model(workload, settings)
    prof = _per_rank(whole, ranks)
    progress.phase(f"solving ({solver})")
    menus = selective_menus(prof) if solver == "auto" else None
    chain = to_chain(prof, scope, menus)
    chain_options = search_options.solver_options
    unchecked = run_solver("none", chain, None, chain_options)
    checked = search_options.fake_run and ranks.strategy is None
    reference_peak = unchecked.peak
    if step.compiled and checked:
        progress.phase("compiling the unchecked step on fake tensors")
        reference_peak = fake_run_peak(
            workload, plan_from_schedule(prof, chain, unchecked, parsed.text, 0, scope)
        )
    budget_bytes = parsed.resolve(reference_peak)
    # A fixed policy is the plan the user named: only the searching solvers hold a margin back.
    held_back = 0.0
    if solver in ("dp", "auto"):
        held_back = held_back_percent(search_options.margin, step.target, step.compiled)
    aim = budget_bytes - round(budget_bytes * held_back / 100)
    baselines = {}
    for name in BASELINES:
        base = run_solver(name, chain, None, chain_options)
        baselines[base.solver] = predict(prof, chain, base, scope).to_json()
    search = Search(
        prof=prof,
        chain=chain,
        menus=menus,
        workload=workload,
        options=chain_options,
        budget_text=parsed.text,
        budget_bytes=budget_bytes,
        aim=aim,
        scope=scope,
        margin=held_back,
        ranks=ranks,
        baselines=baselines,
        checked=checked,
        progress=progress,
    )
    try:
        plan, confirmed = search_plan(search, solver)
    except BelowLeastPeak as exc:
        if scope != "step":  # a budget for activations alone: sharding does not change them
            raise
        advice = sharding_advice(whole, aim, scope, ranks.world_size)
        raise BelowLeastPeak(f"{exc}{advice}", exc.least_bytes) from None
    if plan is not None:
        return plan
    raise CkptplanError(
        f"the checkpointed step, run on fake tensors, needs {format_bytes(confirmed)}, over "
        f"the {format_bytes(aim)} the budget {format_bytes(budget_bytes)} leaves with every "
        f"plan {solver} found for it; use "
        f"{option('budget', format_budget_at_least(admitting_budget(confirmed, held_back)))} "
        "or more"
    )


@keeps_random_state
@renamed_keywords(device="target")
def optimality_gap_of_auto(
    model: ModelArg,
    example_inputs: Inputs | None = None,
    *,
    budget: str | int,
    time_limit_s: float = 60.0,
    profile_options: ProfileOptions | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    **keywords: Any,
) -> GapReport:
    """Auto's plan for an activations ``budget`` against the exact op-graph optimum (the
    ``ilp`` solver) at the same peak: see ``ckptplan.planning.opgraph``."""
    step = fold_keywords(profile_options or ProfileOptions(), keywords)
    refuse_unknown_keywords("optimality_gap_of_auto", keywords)
    parsed = parse_budget(str(budget))
    prof = profile(model, example_inputs, profile_options=step, loss_fn=loss_fn)
    menus = selective_menus(prof)
    chain = to_chain(prof, "activations", menus)
    unchecked = run_solver("none", chain, None)
    budget_bytes = parsed.resolve(unchecked.peak)
    try:
        schedule = run_solver("auto", chain, budget_bytes)
    except InfeasibleBudget as exc:
        refusal = (budget_bytes, prof, "auto", "activations", 0.0)
        raise below_least_peak(exc.least_peak, *refusal) from None
    return optimality_gap(prof, chain, schedule, time_limit_s, menus=menus)


def _per_rank(prof: Profile, ranks: Parallel) -> Profile:
    """One rank's profile under data parallelism; the profile itself on one device."""
    if ranks.strategy is None:
        if ranks.world_size != 1:
            raise CkptplanError(
                f"{option('world_size', ranks.world_size)} needs {option('strategy', 'fsdp')} "
                f"or {option('strategy', 'ddp')}: how the ranks hold the model"
            )
        return prof
    return per_rank(prof, ranks.world_size, ranks.strategy)


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
    if isinstance(workload, HubModel):
        workload = workload.sized_as(the_plan.inputs)
    if the_plan.settings.parallel:
        ranks, mode = the_plan.settings.world_size, the_plan.settings.parallel
        raise CkptplanError(
            f"the plan is per rank ({ranks} ranks, {mode}); verify it where it runs: torchrun "
            f"--nproc_per_node {ranks} examples/train_{mode}.py PLAN --report DIR"
        )
    if isinstance(workload, LiveModel) and the_plan.settings.batch_size is not None:
        the_plan = replace(the_plan, settings=replace(the_plan.settings, batch_size=None))
    progress.phase(f"measuring the step with and without the plan (--repeats {repeats})")
    return verify_plan(workload, the_plan, device=run_on, repeats=repeats, force=force)
