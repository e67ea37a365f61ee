"""The plan file (``ckptplan.plan/1``): decisions, the model they were made for, predictions.

A plan is self-contained: ``ckptplan show plan.json`` needs no model, and ``apply`` checks the
fingerprint before it wraps anything.

A region names its members by module path (``modules``) and, for a module that runs several
times in one forward (ALBERT's shared layer, a backbone run on two views), which call of it
(``calls``, parallel to ``modules``, counted from 0 within one forward of the model)::

    {"modules": ["albert.encoder.albert_layer_groups.0"], "calls": [3]}

A region without ``calls`` (every plan written before calls were planned), or a member whose
call is null, means that module's only call of the step.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ckptplan.errors import CkptplanError
from ckptplan.values.plan_fields import known_fields, value_from_json
from ckptplan.values.policy_types import Policy
from ckptplan.values.prediction import Prediction, StagePrediction
from ckptplan.values.profile_types import Settings
from ckptplan.values.unit_names import split_unit, unit_name

SCHEMA = "ckptplan.plan/1"


@dataclass(frozen=True)
class Region:
    """A checkpointed region: one module, or a run of sibling modules recomputed together."""

    modules: tuple[str, ...]
    children: tuple[Region, ...] = ()
    policy: Policy | None = None
    """Which op outputs the region keeps or offloads (selective checkpointing); None keeps
    only its inputs."""
    calls: tuple[int | None, ...] = ()
    """Which call of each member the region checkpoints, parallel to ``modules`` (see the
    module docstring); empty when every member runs once per forward."""

    @property
    def units(self) -> tuple[str, ...]:
        """The members' unit names (``unit_names``): paths, with the call where set."""
        calls = self.calls or (None,) * len(self.modules)
        return tuple(unit_name(m, c) for m, c in zip(self.modules, calls, strict=True))

    @staticmethod
    def of_units(
        units: tuple[str, ...], children: tuple[Region, ...] = (), policy: Policy | None = None
    ) -> Region:
        """The region of these units (profile block names), calls split off their paths."""
        split = [split_unit(u) for u in units]
        calls = tuple(call for _, call in split)
        return Region(
            modules=tuple(path for path, _ in split),
            children=children,
            policy=policy,
            calls=calls if any(call is not None for call in calls) else (),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"modules": list(self.modules)}
        if self.calls:
            out["calls"] = list(self.calls)
        if self.children:
            out["children"] = [c.to_json() for c in self.children]
        if self.policy is not None:
            out["policy"] = self.policy.to_json()
        return out

    @staticmethod
    def from_json(data: dict[str, Any]) -> Region:
        modules = tuple(data["modules"])
        calls = tuple(data.get("calls", ()))
        if calls and (
            len(calls) != len(modules)
            or not all(c is None or (type(c) is int and c >= 0) for c in calls)
        ):
            raise ValueError(f"region {'+'.join(modules)} has calls {list(calls)}")
        policy = data.get("policy")
        return Region(
            modules=modules,
            children=tuple(Region.from_json(c) for c in data.get("children", ())),
            policy=Policy.from_json(policy, "+".join(modules)) if policy else None,
            calls=calls,
        )


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage's section of a plan (``ckptplan.planning.pipeline``): its blocks and
    regions, its budget and predicted peak with ``in_flight`` microbatches' activations kept at
    once."""

    index: int
    rank: int
    blocks: tuple[str, ...]
    regions: tuple[Region, ...]
    budget_bytes: int
    predicted_peak_bytes: int
    in_flight: int
    parameters: dict[str, Any]
    """The stage's blocks' parameters (count and digest), which ``apply(stage=)`` checks."""
    predicted: StagePrediction
    """The peak's parts: fixed bytes, kept activations per microbatch, buffers, recompute."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            blocks=list(self.blocks),
            regions=[r.to_json() for r in self.regions],
            predicted=self.predicted.to_json(),
        )
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> StagePlan:
        regions = tuple(Region.from_json(r) for r in data["regions"])
        predicted = StagePrediction.from_json(data["predicted"])
        return StagePlan(
            **{**data, "blocks": tuple(data["blocks"]), "regions": regions, "predicted": predicted}
        )


@dataclass(frozen=True)
class PlanBudget:
    """The budget a plan was solved for, as given and in bytes, and what it covers."""

    text: str
    """As the user wrote it (``12GB``, ``60%``)."""
    bytes: int
    scope: str = "step"
    """``step`` (the whole step's peak) or ``activations`` (what checkpointing can change)."""
    margin_percent: float | None = None
    """Percent of the budget held back below it (``--margin``)."""
    aim_bytes: int | None = None
    """The peak the solver aimed at: the budget less the margin."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Keys of the plan file this version does not know, as they were."""

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in known_fields(PlanBudget)}
        return {**{k: v for k, v in data.items() if v is not None}, **self.extra}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> PlanBudget:
        return value_from_json(PlanBudget, data)


@dataclass(frozen=True, kw_only=True)
class PlanSettings(Settings):
    """What a plan was made for: its profile's settings, the scope of its budget, the notes
    the profile made, and the ranks and pipeline it is one part of. A plan from an older
    version may lack a key: it reads as the default.
    """

    scope: str = "step"
    notes: tuple[str, ...] = ()
    """What the profile noticed and did about it (``use_cache`` turned off, ...)."""
    world_size: int = 1
    parallel: str | None = None
    """The data-parallel strategy (``fsdp``, ``ddp``) whose ranks the plan is one of."""
    pipeline: Mapping[str, Any] | None = None
    """The pipeline's layout, for a plan made by ``solve_pipeline``."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Keys of the plan file this version does not know, as they were."""

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in known_fields(PlanSettings)}
        data["notes"] = list(self.notes)
        if self.pipeline is None:  # a plan for one device reads as before
            del data["pipeline"]
        return {**data, **self.extra}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> PlanSettings:
        return replace(value_from_json(PlanSettings, data), notes=tuple(data.get("notes", ())))


@dataclass(frozen=True)
class Plan:
    """Which regions to checkpoint, for which model, and what that is predicted to cost."""

    model: str
    fingerprint: dict[str, Any]
    inputs: Any
    budget: PlanBudget
    solver: str
    settings: PlanSettings
    blocks: tuple[str, ...]
    regions: tuple[Region, ...]
    predicted: Prediction
    baselines: dict[str, Any] = field(default_factory=dict)
    stages: tuple[StagePlan, ...] = ()
    """Pipeline stages, one section each (``ckptplan.planning.pipeline``); none for one device."""
    schema: str = SCHEMA

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["regions"] = [r.to_json() for r in self.regions]
        data["blocks"] = list(self.blocks)
        data["predicted"] = self.predicted.to_json()
        data["budget"] = self.budget.to_json()
        data["settings"] = self.settings.to_json()
        data["stages"] = [s.to_json() for s in self.stages]
        if not self.stages:  # a plan for one device reads as before
            del data["stages"]
        return {"schema": data.pop("schema"), **data}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @staticmethod
    def from_json(data: dict[str, Any], source: str = "plan") -> Plan:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            found = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise CkptplanError(
                f"{source} is not a ckptplan plan (schema {found!r}, expected {SCHEMA!r}); "
                "make one with `ckptplan solve MODEL.py --budget ... -o plan.json`"
            )
        try:
            return Plan(
                model=data["model"],
                fingerprint=data["fingerprint"],
                inputs=data["inputs"],
                budget=PlanBudget.from_json(data["budget"]),
                solver=data["solver"],
                settings=PlanSettings.from_json(data["settings"]),
                blocks=tuple(data["blocks"]),
                regions=tuple(Region.from_json(r) for r in data["regions"]),
                predicted=Prediction.from_json(data["predicted"]),
                baselines=data.get("baselines", {}),
                stages=tuple(StagePlan.from_json(s) for s in data.get("stages", ())),
            )
        except KeyError as exc:
            raise CkptplanError(
                f"{source} is a damaged plan: missing field {exc}; solve again to make a new one"
            ) from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise CkptplanError(
                f"{source} is a damaged plan ({exc}); solve again to make a new one"
            ) from None

    @staticmethod
    def load(path: str | Path) -> Plan:
        file = Path(path)
        if not file.is_file():
            raise CkptplanError(f"plan file {path} not found")
        try:
            data = json.loads(file.read_text())
        except json.JSONDecodeError as exc:
            raise CkptplanError(
                f"{path} is not valid JSON (line {exc.lineno}): {exc.msg}"
            ) from None
        return Plan.from_json(data, source=str(path))


def as_plan(plan: Plan | str | Path) -> Plan:
    return plan if isinstance(plan, Plan) else Plan.load(plan)
