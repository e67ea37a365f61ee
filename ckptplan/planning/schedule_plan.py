"""A solver's schedule written as a plan file: its regions, with their selective policies,
and what the chain model predicts for it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict

from ckptplan.planning.problem import block_forward_ops
from ckptplan.planning.simulate import predict
from ckptplan.solvers.chain import Chain, Schedule
from ckptplan.solvers.selective import Selection
from ckptplan.values.budget import ResolvedBudget
from ckptplan.values.plan import Plan, PlanBudget, PlanSettings, Region
from ckptplan.values.policy_types import Choice, OpCall, Policy
from ckptplan.values.profile_types import OpRecord, Profile


def plan_from_schedule(
    prof: Profile,
    chain: Chain,
    schedule: Schedule,
    budget: ResolvedBudget,
    menus: list[list[Selection]] | None = None,
) -> Plan:
    """The plan file for a solver's schedule of ``prof``'s chain under ``budget`` (``menus``
    name the ops kept by the schedule's selective options).
    """
    scope = budget.scope
    chosen = {block: menus[block][option] for block, option in schedule.options} if menus else {}
    offloaded = sum(selection.offloaded_bytes for selection in chosen.values())
    return Plan(
        model=prof.model_name,
        fingerprint=prof.fingerprint,
        inputs=prof.inputs,
        budget=PlanBudget(
            text=budget.text,
            bytes=budget.bytes,
            scope=scope,
            margin_percent=budget.margin_percent,
            aim_bytes=budget.aim,
        ),
        solver=schedule.solver,
        settings=PlanSettings(**asdict(prof.settings), scope=scope, notes=tuple(prof.notes)),
        blocks=tuple(b.path for b in prof.blocks),
        regions=_regions(prof, chain, schedule, chosen),
        predicted=predict(prof, chain, schedule, scope, offloaded),
        baselines={},
    )


def _regions(
    prof: Profile, chain: Chain, schedule: Schedule, chosen: dict[int, Selection]
) -> tuple[Region, ...]:
    """The schedule's regions in execution order: its segments, and its nested enclosures
    (the module whole, each of its blocks a region inside)."""
    paths = [b.path for b in prof.blocks]
    forward = block_forward_ops(prof) if chosen else []
    regions = [
        (
            start,
            Region.of_units(
                tuple(paths[start:end]), policy=region_policy(forward, start, end, chosen)
            ),
        )
        for start, end in schedule.segments
    ]
    for index in schedule.nested:
        enclosure = chain.enclosures[index]
        inner = tuple(Region.of_units((p,)) for p in paths[enclosure.start : enclosure.end])
        regions.append((enclosure.start, Region((enclosure.name,), children=inner)))
    return tuple(region for _, region in sorted(regions, key=lambda r: r[0]))


def region_policy(
    forward: Sequence[Sequence[OpRecord]],
    start: int,
    end: int,
    selections: Mapping[int, Selection],
) -> Policy | None:
    """The policy of a region of blocks ``[start, end)`` whose blocks run ``selections``, of a
    profile whose blocks' forward ops are ``forward`` (``block_forward_ops``, made once per plan:
    it reads every op of the step).

    A menu names ops ``op#k`` by their call count within one block; a policy counts within its
    region, so the calls of the same overload in the region's earlier blocks are added to ``k``.
    Blocks without a selection recompute everything; None when no block has one.
    """
    if not any(k in selections for k in range(start, end)):
        return None
    before: Counter[str] = Counter()
    calls: dict[Choice, list[OpCall]] = {choice: [] for choice in Choice}
    for k in range(start, end):
        if k in selections:
            chosen = ((Choice.SAVE, selections[k].saved), (Choice.OFFLOAD, selections[k].offloaded))
            for choice, names in chosen:
                for name in names:
                    call = OpCall.parse(name)
                    calls[choice].append(call.after(before[call.op]))
        before.update(op.op for op in forward[k])
    if not any(calls.values()):
        return None
    return Policy(tuple(calls[Choice.SAVE]), tuple(calls[Choice.OFFLOAD]))
