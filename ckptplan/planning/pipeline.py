"""One budget and one plan per pipeline stage (``torch.distributed.pipelining``, torchtitan).

A stage's activation memory is set by how many microbatches its schedule keeps in flight on
it (``ckptplan.values.pipeline_types.in_flight``). The model is profiled once at the microbatch size
(``batch_size / microbatches``, on fake tensors), its chain of blocks split into contiguous
stages, and each rank's plan chosen as the one of least recompute whose pipeline peak fits:

    peak = fixed + buffers + sum_c k_c * kept_c + max_c (one_c - kept_c)

over the rank's stages c (one, or ``stages_per_rank`` interleaved): ``fixed`` the stage's
share of parameters, gradients (present from the first microbatch's backward on, so through
every later peak) and optimizer state, plus the whole batch on the first and the last stage;
``buffers`` PipelineStage's receive buffers (Note [pipeline buffers]); ``kept_c`` what one
microbatch keeps from its forward to its backward under the plan, and ``one_c`` one
microbatch's own peak of activations, both from the stage's chain in scope activations. The
plan's peak grows with the dp solver's target, so each rank bisects it (Note [why bisect]).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from ckptplan import api
from ckptplan.callerstate import keeps_random_state
from ckptplan.deprecation import old_spellings
from ckptplan.devices import held_back_percent
from ckptplan.errors import CkptplanError, option
from ckptplan.loading import Inputs, Workload
from ckptplan.options import (
    Autocast,
    DType,
    Optimizer,
    Parallel,
    ProfileOptions,
    SolveOptions,
    Strategy,
    Target,
    options_from,
)
from ckptplan.planning.problem import selective_menus, to_chain
from ckptplan.planning.schedule_plan import plan_from_schedule
from ckptplan.progress import QUIET, Progress
from ckptplan.solvers import SolverName, SolverOptions, run_solver
from ckptplan.solvers.chain import (
    Chain,
    InfeasibleBudget,
    Schedule,
    run_terms,
    runs,
    simulate,
)
from ckptplan.values.budget import Budget, ResolvedBudget, parse_budget
from ckptplan.values.pipeline_types import Pipeline, balanced_split, in_flight, parameters_digest
from ckptplan.values.plan import Plan, Region, StagePlan
from ckptplan.values.prediction import StagePrediction
from ckptplan.values.profile_types import Profile

BISECT_STEPS = 24


@dataclass(frozen=True)
class _Stage:
    """One stage of the chain: blocks ``[start, end)`` and what its peak is made of."""

    index: int
    start: int
    end: int
    chain: Chain
    fixed: int
    buffers: int
    base_kept: int
    """What one unchecked microbatch keeps from forward to backward."""
    in_flight: int

    def kept(self, schedule: Schedule) -> int:
        """Kept bytes of one microbatch under ``schedule``: unchecked, less what its
        checkpointed runs no longer keep (each run's saving, its RNG state included)."""
        chosen = dict(schedule.options)
        saving = 0
        for start, end, checkpointed, _ in runs(self.chain, schedule.segments):
            if checkpointed:
                blocks = self.chain.blocks
                picks = [
                    blocks[k].options[chosen[k]] if k in chosen else None for k in range(start, end)
                ]
                saving += run_terms(self.chain, start, end, True, picks).saving
        return self.base_kept - saving


def _pipeline_peak(stages: Sequence[_Stage], schedules: Sequence[Schedule]) -> int:
    """A rank's predicted peak with ``schedules`` on its ``stages`` (module docstring)."""
    kept = [s.kept(p) for s, p in zip(stages, schedules, strict=True)]
    held = sum(s.in_flight * k for s, k in zip(stages, kept, strict=True))
    own = max(p.peak - k for p, k in zip(schedules, kept, strict=True))
    return sum(s.fixed + s.buffers for s in stages) + held + own


# Note [why bisect]
#     The dp solver's target bounds one microbatch's peak; the kept bytes it leaves grow with
#     it, so the pipeline peak is (all but) monotone in the target. Each rank bisects the
#     target between the least one-microbatch peak and the unchecked one, keeping, of every
#     target tried, the plan that fits with the least recompute; "full" (every block its own
#     region, the least kept) is tried too, as the plan of least pipeline peak where many
#     microbatches are in flight. A rank's stages share one target.

# Note [pipeline buffers]
#     Measured on PipelineStage (torch 2.13, gloo, CPU, two ranks, tests/models/pipe_gpt.py):
#     ``_setup_forward_recv_info`` allocates one receive buffer of the stage's input per
#     microbatch on every stage but the first, and ``_setup_backward_recv_info`` one of the
#     output's gradient per microbatch on every stage but the last, both kept from the first
#     step on; ``forward_one_chunk`` keeps each in-flight microbatch's output in ``fwd_cache``
#     until its backward. A non-first stage's input is its receive buffer, so the stage's
#     chain leaves that input out. The last stage's outputs are also kept in ``output_chunks``
#     unless the schedule runs with ``return_outputs=False`` (examples/train_pipeline.py does).
#     Measured by ``RankMemory`` on the example (1F1B, 2 stages, 4 microbatches of 2, budget
#     1,877,838 B): rank 0 peaked at 1,839,384 B against 1,847,458 B predicted (0.4% over the
#     measurement), rank 1 at 1,543,980 B against 1,517,342 B (1.7% under it). The last stage's
#     ``fwd_cache`` keeps its output (the logits) too, which the profile does not size apart
#     from the loss; the budget's margin and the other stages' slack covered it there. GPipe,
#     same model and budget 3,154,561 B: 2,803,096 B against 2,943,522 B predicted on rank 0,
#     2,872,760 B against 2,912,310 B on rank 1 (the sum of per-block kept bytes errs high).


def _stage(
    prof: Profile, chain: Chain, pipe: Pipeline, index: int, bounds: tuple[int, int]
) -> _Stage:
    start, end = bounds
    first, last = start == 0, end == len(chain.blocks)
    blocks = chain.blocks[start:end]
    # Activations of the blocks before the stage (on other ranks), and a non-first stage's
    # input, which lives in its receive buffers.
    offset = 0 if first else blocks[0].fwd_start
    shifted = tuple(
        replace(
            b,
            fwd_start=b.fwd_start - offset,
            fwd_peak=b.fwd_peak - offset,
            replay_peak=None if b.replay_peak is None else b.replay_peak - offset,
            bwd_start=b.bwd_start - offset,
            bwd_peak=b.bwd_peak - offset,
            after_peaks=()
            if k == len(blocks) - 1 and not last
            else tuple((v - offset, e) for v, e in b.after_peaks),
        )
        for k, b in enumerate(blocks)
    )
    share = _parameter_share(prof, start, end, first, last)
    fixed_events = tuple(
        (v, e) if "before the blocks" in e else (round(v * share), e)
        for v, e in chain.fixed_peaks
        if first or "before the blocks" not in e
    )
    tail = tuple((v - offset, e) for v, e in chain.tail_peaks) if last else ()
    stage_chain = Chain(shifted, tail, fixed_events, (), chain.region_bytes)
    k = in_flight(pipe, index)
    m = pipe.microbatches
    state = prof.persistent_bytes - prof.input_bytes + prof.gradient_bytes
    fixed = round(share * state) + (m * prof.input_bytes if first or last else 0)
    output = blocks[-1].output_bytes
    buffers = (0 if first else m * blocks[0].input_bytes) + (0 if last else (m + k) * output)
    kept = sum(b.saved_bytes + (b.input_bytes if b.input_kept else 0) for b in blocks)
    if not first:
        kept -= blocks[0].input_bytes if blocks[0].input_kept else 0
    else:
        kept += blocks[0].fwd_start - blocks[0].input_bytes  # what the embeddings keep
    if last:
        kept += max(0, _phase_start(prof, "bwd:post") - _phase_start(prof, "fwd:post"))
    return _Stage(index, start, end, stage_chain, fixed, buffers, kept, k)


def _phase_start(prof: Profile, label: str) -> int:
    return next((start for name, start, _ in prof.phases if name == label), 0)


def _parameter_share(prof: Profile, start: int, end: int, first: bool, last: bool) -> float:
    """The stage's share of the parameters: its blocks', and the modules outside the blocks
    defined before them (embeddings) on the first stage, after them (head) on the last."""
    counts = {path: count for path, _, count in prof.modules}
    total = counts.get("", 0) or 1
    paths = [b.path for b in prof.blocks]
    own = sum(counts.get(p, 0) for p in paths[start:end])
    containers = {p.rpartition(".")[0] for p in paths}
    tops = [(p, c) for p, _, c in prof.modules if p and "." not in p]
    order = [p for p, _ in tops]
    first_block_top = paths[0].partition(".")[0]
    at = order.index(first_block_top) if first_block_top in order else 0
    outside = [(i, p, c) for i, (p, c) in enumerate(tops) if p not in containers and p not in paths]
    if first:
        own += sum(c for i, p, c in outside if i < at)
    if last:
        own += sum(c for i, p, c in outside if i > at)
    return own / total


@old_spellings(device="target")
def solve_pipeline(
    model: api.ModelArg,
    example_inputs: Inputs | None = None,
    *,
    budget: str | int,
    pipeline: Pipeline,
    solver: SolverName = "auto",
    margin: float | None = None,
    offload: bool = True,
    max_segment: int | None = None,
    batch_size: int | None = None,
    optimizer: Optimizer | str | type[torch.optim.Optimizer] = "adamw",
    dtype: DType | torch.dtype = "fp32",
    autocast: Autocast | torch.dtype | None = None,
    target: Target = "cpu",
    blocks: str | None = None,
    measure: bool = False,
    world_size: int = 1,
    strategy: Strategy | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    progress: Progress = QUIET,
) -> Plan:
    """One plan with a section per pipeline stage, each the plan of least recompute whose
    peak, with its schedule's microbatches in flight, fits ``budget`` on its rank; the options
    are ``ckptplan.solve``'s (the whole step, in eager mode).

    ``batch_size`` is the batch per data-parallel rank of a step; a microbatch is
    ``batch_size / pipeline.microbatches``. A fraction budget is of the unchecked peak of the
    rank that needs most. With a ``strategy``, each stage is data parallel.
    """
    step, search, ranks = options_from(locals())
    parsed = parse_budget(str(budget))
    workload = api.workload_of(model, example_inputs, loss_fn)
    return solve_pipeline_with(workload, parsed, pipeline, step, search, ranks, progress)


@keeps_random_state
def solve_pipeline_with(
    workload: Workload,
    budget: Budget,
    pipeline: Pipeline,
    step: ProfileOptions,
    search: SolveOptions,
    data_parallel: Parallel,
    progress: Progress = QUIET,
) -> Plan:
    """``solve_pipeline`` with its options as objects (the CLI's)."""
    solver, batch_size = search.solver, step.batch_size
    if solver not in ("auto", "dp"):
        raise CkptplanError(
            f"{option('solver', solver)} with a pipeline: stages are planned by bisecting "
            f"a searching solver's target; use {option('solver', 'auto')} or "
            f"{option('solver', 'dp')}"
        )
    m = pipeline.microbatches
    if batch_size is None or batch_size % m:
        given = "no batch size" if batch_size is None else option("batch_size", batch_size)
        raise CkptplanError(
            f"{given} does not split into {m} microbatches; use "
            f"{option('batch_size', max(m, (batch_size or m) // m * m))} or another multiple "
            f"of {m}"
        )
    held = held_back_percent(search.margin, step.target)
    microbatch = replace(step, batch_size=batch_size // m)
    prof = api.profile_with(workload, microbatch, data_parallel, progress)
    pipeline.check(len(prof.blocks))
    progress.phase(f"solving {pipeline.chunks} pipeline stages ({solver})")
    menus = selective_menus(prof, offload=search.offload) if solver == "auto" else None
    chain = to_chain(prof, "activations", menus)
    counts = pipeline.split or balanced_split([b.time_fwd for b in prof.blocks], pipeline.chunks)
    ends = [sum(counts[: i + 1]) for i in range(len(counts))]
    bounds = list(zip([0, *ends[:-1]], ends, strict=True))
    stages = [_stage(prof, chain, pipeline, i, b) for i, b in enumerate(bounds)]
    ranks = [stages[r :: pipeline.stages] for r in range(pipeline.stages)]
    options = search.solver_options
    unchecked = [
        _pipeline_peak(rs, [run_solver("none", s.chain, None) for s in rs]) for rs in ranks
    ]
    resolved = budget.resolved(max(unchecked), "step", held)
    chosen: dict[int, tuple[Schedule, int]] = {}
    for rank, rs in enumerate(ranks):
        for stage, (schedule, peak) in zip(
            rs, _fit(rs, solver, resolved.aim, options), strict=True
        ):
            chosen[stage.index] = (schedule, peak)
            if peak > resolved.aim:
                raise resolved.below_least_peak(
                    peak,
                    f"stage {stage.index} (rank {rank}, blocks {prof.blocks[stage.start].path}.."
                    f"{prof.blocks[stage.end - 1].path}, {stage.in_flight} microbatches in "
                    "flight)",
                    ", or fewer microbatches in flight (another schedule, more stages)",
                )
    return _plan(prof, chain, menus, pipeline, stages, chosen, resolved, data_parallel, batch_size)


def _fit(
    stages: Sequence[_Stage], solver: str, aim: int, options: SolverOptions
) -> list[tuple[Schedule, int]]:
    """The rank's schedules of least recompute that fit ``aim`` (Note [why bisect]), each with
    the rank's peak; where none fits, those of the least peak found."""

    def at(target: int) -> list[Schedule]:
        out = []
        for s in stages:
            try:
                out.append(run_solver(solver, s.chain, target, options))
            except InfeasibleBudget as exc:
                out.append(run_solver(solver, s.chain, exc.least_peak, options))
        return out

    tried: list[tuple[int, float, list[Schedule]]] = []

    def attempt(schedules: list[Schedule]) -> int:
        peak = _pipeline_peak(stages, schedules)
        tried.append((peak, sum(p.recompute_time for p in schedules), schedules))
        return peak

    attempt([run_solver("full", s.chain, None) for s in stages])
    low = 0
    high = max(run_solver("none", s.chain, None).peak for s in stages)
    if attempt(at(high)) > aim:
        for _ in range(BISECT_STEPS):
            if high - low <= 1:
                break
            middle = (low + high) // 2
            if attempt(at(middle)) <= aim:
                low = middle
            else:
                high = middle
    fitting = [t for t in tried if t[0] <= aim]
    peak, _, schedules = (
        min(fitting, key=lambda t: (t[1], t[0])) if fitting else min(tried, key=lambda t: t[0])
    )
    return [(schedule, peak) for schedule in schedules]


def _plan(
    prof: Profile,
    chain: Chain,
    menus: Any,
    pipeline: Pipeline,
    stages: Sequence[_Stage],
    chosen: dict[int, tuple[Schedule, int]],
    budget: ResolvedBudget,
    data_parallel: Parallel,
    batch_size: int,
) -> Plan:
    """The whole plan (its regions are every stage's) with one section per stage."""
    segments = []
    options = []
    for stage in stages:
        schedule = chosen[stage.index][0]
        segments += [(a + stage.start, b + stage.start) for a, b in schedule.segments]
        options += [(k + stage.start, o) for k, o in schedule.options]
    step_chain = to_chain(prof, "step", menus)
    whole = simulate(step_chain, segments, chosen[0][0].solver, options)
    plan = plan_from_schedule(prof, step_chain, whole, budget, menus)
    paths = [b.path for b in prof.blocks]
    sections = []
    for stage in stages:
        schedule, peak = chosen[stage.index]
        own = paths[stage.start : stage.end]
        sections.append(
            StagePlan(
                index=stage.index,
                rank=pipeline.rank_of(stage.index),
                blocks=tuple(own),
                regions=tuple(r for r in plan.regions if _inside(r, own)),
                budget_bytes=budget.bytes,
                predicted_peak_bytes=peak,
                in_flight=stage.in_flight,
                parameters=parameters_digest(prof.modules, own),
                predicted=StagePrediction(
                    fixed_bytes=stage.fixed,
                    buffer_bytes=stage.buffers,
                    kept_bytes_per_microbatch=stage.kept(schedule),
                    microbatch_peak_bytes=schedule.peak,
                    recompute_time_s=schedule.recompute_time,
                ),
            )
        )
    return replace(
        plan,
        settings=replace(
            plan.settings,
            world_size=data_parallel.world_size,
            parallel=data_parallel.strategy,
            batch_size=batch_size,
            pipeline=pipeline.layout([s.end - s.start for s in stages], batch_size),
        ),
        predicted=replace(plan.predicted, peak_bytes=max(s.predicted_peak_bytes for s in sections)),
        stages=tuple(sections),
    )


def _inside(region: Region, blocks: Sequence[str]) -> bool:
    return region.units[0] in blocks
