"""The plan file (``ckptplan.plan/1``): decisions, the model they were made for, predictions.

A plan is self-contained: ``ckptplan show plan.json`` needs no model, and ``apply`` checks the
fingerprint before it wraps anything.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ckptplan.errors import CkptplanError

SCHEMA = "ckptplan.plan/1"


@dataclass(frozen=True)
class Region:
    """A checkpointed region: one module, or a run of sibling modules recomputed together."""

    modules: tuple[str, ...]
    children: tuple[Region, ...] = ()
    policy: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"modules": list(self.modules)}
        if self.children:
            out["children"] = [c.to_json() for c in self.children]
        if self.policy is not None:
            out["policy"] = self.policy
        return out

    @staticmethod
    def from_json(data: dict[str, Any]) -> Region:
        return Region(
            modules=tuple(data["modules"]),
            children=tuple(Region.from_json(c) for c in data.get("children", ())),
            policy=data.get("policy"),
        )


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage's section of a plan (``ckptplan.pipeline``): its blocks and regions,
    its budget and predicted peak with ``in_flight`` microbatches' activations kept at once."""

    index: int
    rank: int
    blocks: tuple[str, ...]
    regions: tuple[Region, ...]
    budget_bytes: int
    predicted_peak_bytes: int
    in_flight: int
    parameters: dict[str, Any]
    """The stage's blocks' parameters (count and digest), which ``apply(stage=)`` checks."""
    predicted: dict[str, Any] = field(default_factory=dict)
    """The peak's parts: fixed bytes, kept activations per microbatch, buffers, recompute."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(blocks=list(self.blocks), regions=[r.to_json() for r in self.regions])
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> StagePlan:
        regions = tuple(Region.from_json(r) for r in data["regions"])
        return StagePlan(**{**data, "blocks": tuple(data["blocks"]), "regions": regions})


@dataclass(frozen=True)
class Plan:
    """Which regions to checkpoint, for which model, and what that is predicted to cost."""

    model: str
    fingerprint: dict[str, Any]
    inputs: Any
    budget: dict[str, Any]
    solver: str
    settings: dict[str, Any]
    blocks: tuple[str, ...]
    regions: tuple[Region, ...]
    predicted: dict[str, Any]
    baselines: dict[str, Any] = field(default_factory=dict)
    stages: tuple[StagePlan, ...] = ()
    """Pipeline stages, one section each (``ckptplan.pipeline``); none for one device."""
    schema: str = SCHEMA

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["regions"] = [r.to_json() for r in self.regions]
        data["blocks"] = list(self.blocks)
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
                budget=data["budget"],
                solver=data["solver"],
                settings=data["settings"],
                blocks=tuple(data["blocks"]),
                regions=tuple(Region.from_json(r) for r in data["regions"]),
                predicted=data["predicted"],
                baselines=data.get("baselines", {}),
                stages=tuple(StagePlan.from_json(s) for s in data.get("stages", ())),
            )
        except (KeyError, TypeError) as exc:
            raise CkptplanError(f"{source} is a damaged plan: missing field {exc}") from None

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
