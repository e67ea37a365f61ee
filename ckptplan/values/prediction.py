"""What a plan predicts, as the plan file records it: frozen values, built once.

A plan's figures are made by the chain model (``ckptplan.planning.simulate.predict``), then
confirmed by a fake run; each later figure is a new value (``dataclasses.replace``), never an edit
of the plan's. Plain data, importable without torch, spelled in JSON exactly as plans always were:
keys in the same order, the derived ``overhead`` written beside the times, and keys this
version does not know kept and written back after the known ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ckptplan.values.plan_fields import known_fields, value_from_json


@dataclass(frozen=True)
class Prediction:
    """The predicted peak of a plan's step (by category) and its recompute time.

    A plan from an older version may lack a category (``offloaded_bytes`` is recent): it reads
    as nothing predicted there.
    """

    peak_bytes: int
    peak_event: str = ""
    """The ``PeakEvent`` label of the event the step peaks at."""
    parameters: int = 0
    gradients: int = 0
    optimizer: int = 0
    inputs: int = 0
    activations: int = 0
    recompute_time_s: float = 0.0
    """Time spent recomputing, and moving offloaded tensors to host memory and back."""
    step_time_s: float = 0.0
    """The unchecked step's time; for a compiled plan, the unchecked compiled step's graphs as
    its partition prices them, the same instrument as the plan's recompute time."""
    offloaded_bytes: int = 0
    """Host memory that offloaded tensors hold at the end of forward."""
    compiled_partition: dict[str, Any] | None = None
    """For a compiled step, the partition the fake run's compile made (what it saves)."""
    fake_run_peak_bytes: int | None = None
    """The peak of the checkpointed step executed on fake tensors, when it was run."""
    in_flight: int | None = None
    """For one pipeline stage's plan, the microbatches its peak holds at once."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Keys of the plan file this version does not know, as they were."""

    @property
    def overhead(self) -> float:
        """Predicted extra step time from recomputation, as a fraction of the unchecked step."""
        return self.recompute_time_s / self.step_time_s if self.step_time_s else 0.0

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for name in known_fields(Prediction):
            value = getattr(self, name)
            if value is not None:
                data[name] = value
            if name == "offloaded_bytes":
                data["overhead"] = self.overhead
        return {**data, **self.extra}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Prediction:
        return value_from_json(Prediction, data, derived=("overhead",))


@dataclass(frozen=True)
class StagePrediction:
    """One pipeline stage's peak in parts (``ckptplan.planning.pipeline``)."""

    fixed_bytes: int
    """Its parameters, gradients, optimizer state and batch."""
    buffer_bytes: int
    """PipelineStage's receive buffers and the outputs it keeps until their backward."""
    kept_bytes_per_microbatch: int
    """What each microbatch in flight keeps from forward to backward under the plan."""
    microbatch_peak_bytes: int
    """One microbatch's own peak."""
    recompute_time_s: float
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Keys of the plan file this version does not know, as they were."""

    def to_json(self) -> dict[str, Any]:
        return {
            **{name: getattr(self, name) for name in known_fields(StagePrediction)},
            **self.extra,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> StagePrediction:
        return value_from_json(StagePrediction, data)
