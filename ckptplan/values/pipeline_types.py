"""Pipeline-parallel options, torch-free: the schedule, the stage split, microbatches in flight.

``Pipeline`` is what ``ckptplan solve --pipeline-stages P --microbatches M --schedule S`` and
``ckptplan.solve_pipeline(..., pipeline=Pipeline(...))`` take; ``ckptplan.planning.pipeline`` turns
it into one budget and one plan per stage. The figures here are plain integers, so the CLI can
check its flags before importing torch, and the tests can check the counts in doctests.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ckptplan.errors import CkptplanError, option
from ckptplan.values.budget import format_bytes
from ckptplan.values.plan import Plan

ScheduleName = Literal["gpipe", "1f1b", "interleaved-1f1b"]
SCHEDULES: tuple[str, ...] = get_args(ScheduleName)


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    """How the model is split and run: ``stages`` ranks in the pipeline, ``microbatches`` per
    step, the ``schedule``, and for interleaved 1F1B the virtual ``stages_per_rank``.

    ``split``, if given, is the number of blocks of each (virtual) stage in order; otherwise
    the blocks are split to balance forward time (``balanced_split``).
    """

    stages: int
    microbatches: int
    schedule: ScheduleName
    stages_per_rank: int = 1
    split: tuple[int, ...] | None = None

    @property
    def chunks(self) -> int:
        """Stages of the chain: one per rank, or ``stages_per_rank`` per rank if interleaved."""
        return self.stages * self.stages_per_rank

    def layout(self, split: Sequence[int], batch_size: int) -> dict[str, Any]:
        """How a plan's settings record the pipeline: the blocks of each stage as split, and
        the microbatch size the stages were profiled at.

        >>> Pipeline(stages=2, microbatches=4, schedule="1f1b").layout([3, 3], 8)["microbatch_size"]
        2
        """
        return {
            "stages": self.stages,
            "microbatches": self.microbatches,
            "schedule": self.schedule,
            "stages_per_rank": self.stages_per_rank,
            "split": list(split),
            "microbatch_size": batch_size // self.microbatches,
        }

    def check(self, blocks: int) -> None:
        """Refuse, in one line naming the flag and the fix, what no schedule can run."""
        if self.schedule not in SCHEDULES:
            raise CkptplanError(
                f"{option('schedule', self.schedule)} is no pipeline schedule; choose one of "
                f"{', '.join(SCHEDULES)}"
            )
        if self.stages < 2:
            raise CkptplanError(
                f"{option('pipeline_stages', self.stages)}: a pipeline needs at least 2 stages; "
                f"use {option('pipeline_stages', 2)} or more, or leave it out for one device"
            )
        interleaved = self.schedule == "interleaved-1f1b"
        if interleaved and self.stages_per_rank < 2:
            raise CkptplanError(
                f"{option('stages_per_rank', self.stages_per_rank)}: interleaved 1F1B runs at "
                f"least 2 virtual stages per rank; use {option('stages_per_rank', 2)}"
            )
        if not interleaved and self.stages_per_rank != 1:
            raise CkptplanError(
                f"{option('stages_per_rank', self.stages_per_rank)} is for "
                f"{option('schedule', 'interleaved-1f1b')}; {self.schedule} runs one stage a rank"
            )
        if self.microbatches < 1 or (self.schedule != "gpipe" and self.microbatches < self.stages):
            raise CkptplanError(
                f"{option('microbatches', self.microbatches)} with {self.stages} stages: "
                f"{self.schedule} needs at least one microbatch per stage; use "
                f"{option('microbatches', max(self.stages, 1))} or more"
            )
        if interleaved:
            rounds = max(1, self.microbatches // self.stages)
            if self.microbatches % rounds:
                raise CkptplanError(
                    f"{option('microbatches', self.microbatches)}: interleaved 1F1B needs a "
                    f"multiple of its {rounds} rounds (microbatches // stages); use "
                    f"{option('microbatches', rounds * self.stages)}"
                )
        if self.chunks > blocks:
            raise CkptplanError(
                f"{option('pipeline_stages', self.stages)} makes {self.chunks} stages of a chain "
                f"of {blocks} blocks; use at most {blocks // self.stages_per_rank} stages"
            )
        split = self.split
        if split is not None and (
            len(split) != self.chunks or min(split) < 1 or sum(split) != blocks
        ):
            text = ",".join(map(str, split))
            raise CkptplanError(
                f"{option('stage_split', text)}: give {self.chunks} block counts of at least "
                f"1 that add up to the chain's {blocks} blocks, e.g. "
                f"{option('stage_split', ','.join(map(str, _even(blocks, self.chunks))))}"
            )

    def rank_of(self, chunk: int) -> int:
        """The rank running stage ``chunk``: interleaved ranks hold every ``stages``-th one."""
        return chunk % self.stages


def _even(blocks: int, parts: int) -> list[int]:
    return [blocks // parts + (k < blocks % parts) for k in range(parts)]


def in_flight(pipeline: Pipeline, chunk: int) -> int:
    """Microbatches whose activations stage ``chunk`` holds at once, at most, in a step.

    GPipe runs every forward before any backward; 1F1B's stage i runs ``P - i`` forwards
    before its first backward, then one of each; interleaved 1F1B as torch orders it
    (Note [interleaved 1F1B in flight]).

    >>> [in_flight(Pipeline(stages=4, microbatches=8, schedule="gpipe"), i) for i in range(4)]
    [8, 8, 8, 8]
    >>> [in_flight(Pipeline(stages=4, microbatches=8, schedule="1f1b"), i) for i in range(4)]
    [4, 3, 2, 1]
    >>> [in_flight(Pipeline(stages=4, microbatches=2, schedule="gpipe"), i) for i in range(2)]
    [2, 2]
    >>> p = Pipeline(stages=2, microbatches=4, schedule="interleaved-1f1b", stages_per_rank=2)
    >>> [in_flight(p, i) for i in range(4)]  # stages 0 and 2 on rank 0, 1 and 3 on rank 1
    [4, 3, 2, 1]
    """
    m, p = pipeline.microbatches, pipeline.stages
    if pipeline.schedule == "gpipe":
        return m
    if pipeline.schedule == "1f1b":
        return min(m, p - chunk)
    return _interleaved_peak(pipeline, pipeline.rank_of(chunk))[chunk // p]


def _interleaved_peak(pipeline: Pipeline, rank: int) -> list[int]:
    """The most microbatches in flight on each local stage of ``rank`` under interleaved 1F1B,
    replaying the order of torch's ``ScheduleInterleaved1F1B`` (its warm-up count, then one
    forward and one backward per step, then the cool-down's backwards)."""
    m, p, v = pipeline.microbatches, pipeline.stages, pipeline.stages_per_rank
    per_round = m // max(1, m // p)
    warmup = min((v - 1) * per_round + 2 * (p - 1 - rank), m * v)
    total = m * v
    held = [0] * v
    most = [0] * v
    for step in range(total + warmup):
        if step < total:  # forwards: the warm-up's, then one per 1F1B step
            local = (step // per_round) % v
            held[local] += 1
            most[local] = max(most[local], held[local])
        if step >= warmup:  # backwards: one per 1F1B step, then the cool-down's
            held[v - 1 - ((step - warmup) // per_round) % v] -= 1
    return most


# Note [interleaved 1F1B in flight]
#     torch/distributed/pipelining/schedules.py (torch 2.13), ``_get_warmup_ops``: rank r of P
#     with V local stages and ``per_round = M // max(1, M // P)`` microbatches per round runs
#     ``min((V - 1) * per_round + 2 * (P - 1 - r), M * V)`` warm-up forwards; then
#     ``_get_1f1b_rank_ops`` alternates one forward (local stage ``(s // per_round) % V``) and
#     one backward (local stage ``V - 1 - ((s - warmup) // per_round) % V``), and the cool-down
#     runs the remaining backwards. ``_interleaved_peak`` replays that order and keeps each
#     local stage's highest count; summing those over a rank's stages may exceed what it holds
#     at any one moment, so the rank's budget errs on the safe side. For 1F1B the count is
#     ``ScheduleOneFOneB``'s ``warmup_chunks = min(M, P - i)`` (same file) plus nothing: its
#     steady state does one forward after each backward.


def balanced_split(times: Sequence[float], parts: int) -> tuple[int, ...]:
    """Block counts of ``parts`` contiguous stages of blocks taking ``times`` (forward
    seconds): the least slowest stage, then the least largest stage by blocks, then the
    earliest stages smallest (1F1B's first stage keeps the most microbatches).

    >>> balanced_split([1.0] * 6, 2), balanced_split([1.0] * 7, 2)
    ((3, 3), (3, 4))
    >>> balanced_split([4.0, 1.0, 1.0, 1.0, 1.0], 2)
    (1, 4)
    >>> balanced_split([0.0] * 5, 3)
    (1, 2, 2)
    """
    n = len(times)
    total = sum(times) or 1.0
    # Times in integer units, so that equal blocks tie exactly however they are summed.
    units = [round(t / total * 10**9) for t in times]
    prefix = [0]
    for u in units:
        prefix.append(prefix[-1] + u)
    # best[k][j]: the best (slowest, largest, counts) split of the first j blocks in k stages.
    best: list[dict[int, tuple[int, int, tuple[int, ...]]]] = [{0: (0, 0, ())}]
    for k in range(1, parts + 1):
        row = {}
        for j in range(k, n - (parts - k) + 1):
            candidates = []
            for i in range(k - 1, j):
                if i not in best[k - 1]:
                    continue
                slow, large, counts = best[k - 1][i]
                stage = prefix[j] - prefix[i]
                candidates.append((max(slow, stage), max(large, j - i), (*counts, j - i)))
            row[j] = min(candidates)
        best.append(row)
    return best[parts][n][2]


def parameters_digest(modules: Sequence[tuple[str, str, int]], blocks: Sequence[str]) -> dict:
    """The identity of a stage's blocks: count and digest of (path, class, parameter count) of
    every module at or under them, as ``Profile.modules`` records them and a stage module has
    them (the same qualified names as in the whole model).

    >>> parameters_digest([("a", "Linear", 6), ("a.x", "ReLU", 0), ("b", "Linear", 6)], ["a"])
    {'parameters': 6, 'hash': '4dc8ee58e26bf591'}
    """
    own = [
        [path, kind, count]
        for path, kind, count in modules
        if any(path == b or path.startswith(b + ".") for b in blocks)
    ]
    digest = hashlib.sha256(json.dumps(own).encode()).hexdigest()[:16]
    tops = [count for path, _, count in own if path in blocks]
    return {"parameters": sum(tops), "hash": digest}


def stage_lines(plan: Plan) -> list[str]:
    """One line per pipeline stage of ``plan`` (none for a plan without stages), for
    ``solve`` and ``show``."""
    lines = []
    for stage in plan.stages:
        regions = ", ".join("+".join(r.units) for r in stage.regions) or "none"
        lines.append(
            f"stage {stage.index} (rank {stage.rank}): {stage.blocks[0]}..{stage.blocks[-1]}, "
            f"{stage.in_flight} microbatches in flight, predicted peak "
            f"{format_bytes(stage.predicted_peak_bytes)} of {format_bytes(stage.budget_bytes)}; "
            f"checkpointed: {regions}"
        )
    return lines
