"""A solver's schedule written as a plan file: its regions, with their selective policies,
and what the chain model predicts for it."""

from __future__ import annotations

from dataclasses import asdict

from ckptplan.planning.problem import region_policy
from ckptplan.planning.simulate import predict
from ckptplan.solvers.chain import Chain, Schedule
from ckptplan.solvers.selective import Selection
from ckptplan.values.budget import ResolvedBudget
from ckptplan.values.plan import Plan, PlanBudget, PlanSettings, Region
from ckptplan.values.profile_types import Profile


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
    regions = [
        (
            start,
            Region.of_units(
                tuple(paths[start:end]), policy=region_policy(prof, start, end, chosen)
            ),
        )
        for start, end in schedule.segments
    ]
    for index in schedule.nested:
        enclosure = chain.enclosures[index]
        inner = tuple(Region.of_units((p,)) for p in paths[enclosure.start : enclosure.end])
        regions.append((enclosure.start, Region((enclosure.name,), children=inner)))
    return tuple(region for _, region in sorted(regions, key=lambda r: r[0]))
