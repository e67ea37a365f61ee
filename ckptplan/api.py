"""The Python API, mirroring the CLI: ``profile``, ``solve``, ``verify``.

Each option is a keyword-only parameter named as its CLI flag (Note [one field per option] in
``ckptplan.options``), so ``help(ckptplan.solve)`` lists them with their defaults. Inside,
they travel as one object per concern (``ProfileOptions`` for the step, ``SolveOptions`` for
the search, ``Parallel`` for the ranks): ``solve_with`` and ``profile_with`` take those, for
the CLI and ``fit``. Old spellings (``device=``, ``parallel="fsdp"``, an options object for a
concern) still work for one release, with a ``DeprecationWarning`` (``ckptplan.deprecation``).

Example:
    >>> plan = ckptplan.solve("sample_models/gpt.py", budget="60%", solver="dp")  # doctest: +SKIP
    >>> plan = ckptplan.solve(
    ...     "sample_models/gpt.py", budget="12GB", batch_size=8, target="h100",
    ...     world_size=8, strategy="fsdp",
    ... )  # doctest: +SKIP
    >>> model = ckptplan.apply(build_model(), plan)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ckptplan.callerstate import keeps_random_state
from ckptplan.deprecation import old_spellings
from ckptplan.devices import held_back_percent
from ckptplan.errors import BelowLeastPeak, CkptplanError, option
from ckptplan.hub import HubModel
from ckptplan.huggingface import is_hub_name
from ckptplan.loading import Inputs, LiveModel, Workload, load_model_file
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
    precision,
)
from ckptplan.planning.distributed import per_rank
from ckptplan.planning.opgraph import GapReport, optimality_gap
from ckptplan.planning.problem import selective_menus, to_chain
from ckptplan.planning.scaleout import sharding_advice
from ckptplan.planning.schedule_plan import plan_from_schedule
from ckptplan.planning.search import Search, search_plan
from ckptplan.planning.simulate import predict
from ckptplan.profiling.profiler import profile_model
from ckptplan.profiling.training import dtype_name, optimizer_name
from ckptplan.progress import QUIET, Progress
from ckptplan.solvers import BASELINES, SOLVERS, SolverName, run_solver
from ckptplan.solvers.chain import InfeasibleBudget
from ckptplan.stepping.fakerun import fake_run_peak
from ckptplan.values.budget import Budget, ResolvedBudget, format_bytes, parse_budget
from ckptplan.values.plan import Plan, as_plan
from ckptplan.values.profile_types import Profile, Settings
from ckptplan.verifying.verification import Verification, verify_plan

ModelArg = torch.nn.Module | str | Path | HubModel
"""A model object (with its example inputs), a model file, ``hf:NAME_OR_DIR``, or a
``HubModel`` (``hf:`` with its task and input sizes)."""


def load_workload(model: str | Path | HubModel) -> Workload:
    """The workload a model file or ``hf:`` name stands for (as the commands take them)."""
    return workload_of(model, None, None)


def workload_of(
    model: ModelArg,
    example_inputs: Inputs | None,
    loss_fn: Callable[[Any], torch.Tensor] | None,
) -> Workload:
    """What a call's ``model`` stands for: a live model with its example inputs (and loss), a
    ``HubModel``, an ``hf:`` name or a model file (``MODULE:FUNCTION`` too)."""
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


@old_spellings(device="target")
def profile(
    model: ModelArg,
    example_inputs: Inputs | None = None,
    *,
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
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    progress: Progress = QUIET,
) -> Profile:
    """Profile one training step on fake tensors (nothing is allocated), priced for the
    ``target`` device.

    The step: ``batch_size`` (a model file's; None: its own), ``optimizer`` (a name, or a
    ``torch.optim`` class), ``dtype`` (or a ``torch.dtype``; ``bf16-mixed`` is fp32 weights
    under ``autocast`` bf16), ``blocks`` (module paths of the chain, ``layers.*``; None:
    found), ``compiled`` (priced as ``torch.compile`` runs it). ``measure=True`` also runs the
    step for real on this machine and times every op. With a ``strategy`` ("fsdp" or "ddp")
    and ``world_size``, the profile is one rank's.
    """
    step, _, ranks = options_from(locals())
    return profile_with(workload_of(model, example_inputs, loss_fn), step, ranks, progress)


@keeps_random_state
def profile_with(
    workload: Workload, step: ProfileOptions, ranks: Parallel, progress: Progress = QUIET
) -> Profile:
    """``profile`` with its options as objects (the CLI's, ``solve_pipeline``'s)."""
    settings = settings_of(step)
    progress.phase(_profiling(settings))
    return _per_rank(profile_model(workload, settings), ranks)


def _profiling(settings: Settings) -> str:
    """The profiling phase, as a progress display names it."""
    if settings.measure:
        return "profiling one training step on fake tensors, then timing its ops for real"
    return "profiling one training step on fake tensors"


@old_spellings(device="target")
def solve(
    model: ModelArg,
    example_inputs: Inputs | None = None,
    *,
    budget: str | int,
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
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    progress: Progress = QUIET,
) -> Plan:
    """Profile the model and return the plan of least recompute time that fits ``budget``
    (``12GB``, ``11.5GiB``, ``60%`` of the unchecked peak) on the ``target`` device, less the
    ``margin`` percent of it held back (default: the target's, 0.1 on the CPU, 3 on a GPU).

    The search: ``solver`` (``auto`` adds selective policies to ``dp``'s regions; ``none``,
    ``full``, ``sqrt``, ``every-k`` with ``every``, are fixed plans), ``scope`` (the budget
    holds the whole ``step``'s peak, or the ``activations`` alone), ``max_segment`` (the most
    blocks in one region), ``offload`` (False: no policy moves tensors to host memory; by
    default only where a copy pays, Note [when offload pays] in ``ckptplan.devices``). The
    step and the ranks: as ``profile`` takes them.

    With ``fake_run`` (the default) the chosen plan is executed on fake tensors to confirm
    its peak; should the real checkpointed code need more than the chain model predicted,
    the solver is asked again with the difference taken off the budget.

    With a ``strategy`` ("fsdp" or "ddp") and ``world_size`` the budget, the profile and the
    plan are one rank's (``batch_size`` is the per-rank batch); the fake run, which executes
    one unsharded device, is skipped.

    With ``compiled``, the plan is for ``apply`` then ``torch.compile``: the step is priced
    fused, and the fake run compiles it, so the budget holds the partition AOTAutograd makes
    (a percentage is of the compiled unchecked step's peak); the plan records that partition.
    """
    step, search, ranks = options_from(locals())
    parsed = parse_budget(str(budget))
    workload = workload_of(model, example_inputs, loss_fn)
    return solve_with(workload, parsed, step, search, ranks, progress)


SEARCHING = ("dp", "auto")
"""The solvers that search for a plan under the budget: only they hold a margin back (a fixed
policy is the plan the user named)."""


@keeps_random_state
def solve_with(
    workload: Workload,
    budget: Budget,
    step: ProfileOptions,
    search: SolveOptions,
    ranks: Parallel,
    progress: Progress = QUIET,
) -> Plan:
    """``solve`` with its options as objects (the CLI's, ``fit``'s, ``autoplan``'s)."""
    solver, scope = search.solver, search.scope
    if solver not in SOLVERS:
        raise CkptplanError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    held_back = held_back_percent(search.margin, step.target, step.compiled)
    settings = settings_of(step)
    progress.phase(_profiling(settings))
    whole = profile_model(workload, settings)
    prof = _per_rank(whole, ranks)
    progress.phase(f"solving ({solver})")
    menus = selective_menus(prof, offload=search.offload) if solver == "auto" else None
    chain = to_chain(prof, scope, menus)
    unchecked = run_solver("none", chain, None, search.solver_options)
    checked = search.fake_run and ranks.strategy is None
    reference_peak = unchecked.peak
    if step.compiled and checked:
        progress.phase("compiling the unchecked step on fake tensors")
        unchecked_plan = plan_from_schedule(prof, chain, unchecked, ResolvedBudget(budget.text, 0))
        reference_peak = fake_run_peak(workload, unchecked_plan)
    resolved = budget.resolved(reference_peak, scope, held_back if solver in SEARCHING else 0.0)
    baselines = {}
    for name in BASELINES:
        base = run_solver(name, chain, None, search.solver_options)
        baselines[base.solver] = predict(prof, chain, base, scope).to_json()
    problem = Search(
        prof=prof,
        chain=chain,
        menus=menus,
        workload=workload,
        options=search.solver_options,
        budget=resolved,
        offload=search.offload,
        ranks=ranks,
        baselines=baselines,
        checked=checked,
        progress=progress,
    )
    try:
        plan, confirmed = search_plan(problem, solver)
    except BelowLeastPeak as exc:
        if scope != "step":  # a budget for activations alone: sharding does not change them
            raise
        advice = sharding_advice(whole, resolved.aim, scope, ranks.world_size)
        raise BelowLeastPeak(f"{exc}{advice}", exc.least_bytes) from None
    if plan is not None:
        return plan
    raise CkptplanError(
        f"the checkpointed step, run on fake tensors, needs {format_bytes(confirmed)}, over "
        f"the {format_bytes(resolved.aim)} the budget {format_bytes(resolved.bytes)} leaves "
        f"with every plan {solver} found for it; use "
        f"{option('budget', resolved.at_least(confirmed))} or more"
    )


@old_spellings(device="target")
def optimality_gap_of_auto(
    model: ModelArg,
    example_inputs: Inputs | None = None,
    *,
    budget: str | int,
    time_limit_s: float = 60.0,
    batch_size: int | None = None,
    optimizer: Optimizer | str | type[torch.optim.Optimizer] = "adamw",
    dtype: DType | torch.dtype = "fp32",
    autocast: Autocast | torch.dtype | None = None,
    target: Target = "cpu",
    blocks: str | None = None,
    measure: bool = False,
    compiled: bool = False,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
) -> GapReport:
    """Auto's plan for an activations ``budget`` against the exact op-graph optimum (the
    ``ilp`` solver) at the same peak: see ``ckptplan.planning.opgraph``. The step's options
    are ``profile``'s."""
    step = options_from(locals())[0]
    parsed = parse_budget(str(budget))
    return optimality_gap_with(
        workload_of(model, example_inputs, loss_fn), parsed, step, time_limit_s
    )


def optimality_gap_with(
    workload: Workload, budget: Budget, step: ProfileOptions, time_limit_s: float = 60.0
) -> GapReport:
    """``optimality_gap_of_auto`` with the step's options as an object (the CLI's)."""
    prof = profile_with(workload, step, Parallel())
    menus = selective_menus(prof)
    chain = to_chain(prof, "activations", menus)
    unchecked = run_solver("none", chain, None)
    resolved = budget.resolved(unchecked.peak, "activations", 0.0)
    try:
        schedule = run_solver("auto", chain, resolved.bytes)
    except InfeasibleBudget as exc:
        of = f"{prof.model_name} with solver auto (scope activations)"
        raise resolved.below_least_peak(exc.least_peak, of) from None
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
@old_spellings(device="run_on")
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
    workload = workload_of(model, example_inputs, loss_fn)
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
