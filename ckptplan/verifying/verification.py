"""Ground truth for one plan: its training step measured on the local device against the
unchecked step of the same model and batch (docs/design.md §8), as a ``Verification``.

Memory is the peak of one steady-state step (``ckptplan.stepping.steppeak``), with the profiler's
live-storage tracker's figure beside the allocator's on CPU; time is the median of paired
steps (``ckptplan.verifying.pairtiming``); gradients are compared after the same seeded forward and
backward, dropout included (``ckptplan.verifying.gradcompare``). A plan made for ``torch.compile``
is measured compiled by inductor, beside the compiled unchecked step.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch._inductor import config as inductor_config

from ckptplan.applying.install import apply
from ckptplan.errors import CkptplanError, option
from ckptplan.loading import Workload
from ckptplan.patching import patched_config
from ckptplan.stepping.compiled import CompiledModel, Partition, inductor_backend
from ckptplan.stepping.graphbreaks import counting_breaks
from ckptplan.values.plan import Plan, PlanSettings
from ckptplan.verifying.comparison import Comparison, compare
from ckptplan.verifying.gradcompare import seeded_grads
from ckptplan.verifying.localrun import baseline_run, run_device
from ckptplan.verifying.pairtiming import check_repeats


@dataclass(frozen=True)
class CompiledFigures:
    """A compiled plan's step (inductor) beside the compiled unchecked step; the baseline of
    its ``Verification`` stays the eager unchecked step."""

    compile_time_s: float
    """The first step's time less a steady step's: compiling forward and backward."""
    unchecked_peak_bytes: int
    unchecked_step_time_ratio: float
    """The compiled unchecked step's time over the eager one's."""
    step_time_ratio: float
    """The plan's compiled step over the compiled unchecked one: two paired measurements
    against the same eager step, divided."""
    graphs: int = 0
    """Forward graphs inductor compiled for the plan's step (one where nothing breaks)."""
    graph_breaks: int = 0
    unchecked_graphs: int = 0
    unchecked_graph_breaks: int = 0

    @property
    def graphs_match(self) -> bool:
        """No more compiled graphs or graph breaks than the unchecked model: the plan added
        no break (a break in a loop sends the loop to eager, which can leave fewer graphs)."""
        return (
            self.graphs <= self.unchecked_graphs
            and self.graph_breaks <= self.unchecked_graph_breaks
        )


@dataclass(frozen=True)
class Verification:
    """Measured against predicted, for one plan on the local device."""

    device: str
    budget_bytes: int
    predicted_peak_bytes: int
    measured_peak_bytes: int
    baseline_peak_bytes: int
    step_time_ratio: float
    step_time_s: float
    baseline_step_time_s: float
    max_grad_abs_diff: float
    grad_tolerance: float
    regions: int
    step_time_ratio_range: tuple[float, float] = (0.0, 0.0)
    """Least and greatest step-time ratio of the timed pairs: how noisy the timing was."""
    tracked_peak_bytes: int | None = None
    """The same peak by the profiler's own live-storage tracker (CPU), beside the allocator's
    ``measured_peak_bytes``: where they differ, the tracker misses something."""
    predicted_overhead: float | None = None
    """The plan's predicted recompute time over its step time, beside ``step_time_ratio - 1``."""
    reserved_peak_bytes: int | None = None
    """On CUDA, the peak the caching allocator reserved (what ``nvidia-smi`` sees, less the
    context): ``measured_peak_bytes`` plus rounding to segments and fragmentation."""
    compiled: CompiledFigures | None = None
    """For a plan made for ``torch.compile``: what the compiled step adds to the figures."""

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "within_budget": self.within_budget,
            "grads_match": self.grads_match,
            "prediction_error": self.prediction_error,
            "overhead_agrees": self.overhead_agrees,
            "graphs_match": self.graphs_match,
        }

    @property
    def graphs_match(self) -> bool:
        """A compiled plan's step compiles into no more graphs, with no more graph breaks,
        than the unchecked step."""
        return self.compiled is None or self.compiled.graphs_match

    @property
    def within_budget(self) -> bool:
        return self.measured_peak_bytes <= self.budget_bytes

    @property
    def grads_match(self) -> bool:
        return self.max_grad_abs_diff <= self.grad_tolerance

    @property
    def overhead_agrees(self) -> bool:
        """Predicted and measured recompute overhead within 25% of each other (relative)."""
        if self.predicted_overhead is None:
            return True
        measured = self.measured_overhead
        return abs(measured - self.predicted_overhead) <= 0.25 * max(abs(measured), 1e-9)

    @property
    def measured_overhead(self) -> float:
        """The plan's step over the unchecked step of its kind (compiled for a compiled plan),
        less one: what ``predicted_overhead`` predicts."""
        ratio = self.compiled.step_time_ratio if self.compiled else self.step_time_ratio
        return ratio - 1

    @property
    def prediction_error(self) -> float:
        """|measured - predicted| as a fraction of measured."""
        return abs(self.measured_peak_bytes - self.predicted_peak_bytes) / self.measured_peak_bytes


def verify_plan(
    model_file: Workload,
    plan: Plan,
    device: str | None = None,
    repeats: int = 3,
    force: bool = False,
) -> Verification:
    """Measure the plan's step against the unchecked step of the same model and batch."""
    check_repeats(repeats)
    target = run_device(device)
    kind = plan.settings.device
    if (kind == "cpu") != (target.type == "cpu") and not force:
        on = option("run_on", "cuda" if kind != "cpu" else "cpu")
        where = f"a CUDA GPU ({on})" if kind != "cpu" else f"the CPU ({on})"
        again = option("target", "cpu" if target.type == "cpu" else "h100")
        raise CkptplanError(
            f"the plan was made for {kind} and predicts that device's memory; verify it on "
            f"{where}, solve again with {again}, or pass {option('force', True)} to measure it "
            "here anyway"
        )
    baseline_model, inputs, dtype = baseline_run(model_file, plan.settings, target)
    planned_model = apply(copy.deepcopy(baseline_model), plan, force=force)
    compiled = None
    if plan.settings.compiled:
        # Inductor draws its own dropout masks unless told to use eager's: with eager's, the
        # compiled plan's gradients compare seed for seed with the eager step's.
        with patched_config(inductor_config, fallback_random=True):
            compiled, result = _compare_compiled(
                model_file, plan.settings, baseline_model, planned_model, inputs, target, repeats
            )
    else:
        result = compare(
            model_file, plan.settings, baseline_model, planned_model, inputs, target, repeats
        )
    predicted = plan.predicted.fake_run_peak_bytes if compiled else None
    return Verification(
        device=str(target),
        budget_bytes=int(plan.budget.bytes),
        predicted_peak_bytes=int(predicted or plan.predicted.peak_bytes),
        measured_peak_bytes=result.measured_peak_bytes,
        baseline_peak_bytes=result.baseline_peak_bytes,
        step_time_ratio=result.step_time_ratio,
        step_time_s=result.step_time_s,
        baseline_step_time_s=result.baseline_step_time_s,
        max_grad_abs_diff=result.max_grad_abs_diff,
        grad_tolerance=1e-6 if dtype == torch.float32 else 1e-2,
        regions=len(plan.regions),
        step_time_ratio_range=result.step_time_ratio_range,
        tracked_peak_bytes=result.tracked_peak_bytes,
        predicted_overhead=plan.predicted.overhead,
        reserved_peak_bytes=result.reserved_peak_bytes,
        compiled=compiled,
    )


def _compiled(
    model: torch.nn.Module, model_file: Workload, inputs: Any, autocast: str | None
) -> tuple[torch.nn.Module, float, Partition]:
    """``model`` compiled by inductor, the seconds its first step took over its second, and
    the graphs and graph breaks compiling it made."""
    log = Partition()
    compiled = CompiledModel(model, inductor_backend(log))
    times = []
    for _ in range(2):
        start = time.perf_counter()
        with counting_breaks(log):
            seeded_grads(model_file, compiled, inputs, autocast)
        times.append(time.perf_counter() - start)
    return compiled, max(times[0] - times[1], 0.0), log


def _compare_compiled(
    model_file: Workload,
    settings: PlanSettings,
    baseline_model: torch.nn.Module,
    planned_model: torch.nn.Module,
    inputs: Any,
    target: torch.device,
    repeats: int,
) -> tuple[CompiledFigures, Comparison]:
    """The planned model compiled against the eager baseline, and the compiled unchecked model
    against it too. The live-storage tracker cannot follow inductor's kernels: the allocator's
    figure alone."""
    autocast = settings.autocast
    # Each comparison trains its pair: the compiled unchecked model's has its own eager copy.
    eager = copy.deepcopy(baseline_model)
    unchecked, _, plain = _compiled(copy.deepcopy(baseline_model), model_file, inputs, autocast)
    base = compare(model_file, settings, eager, unchecked, inputs, target, repeats, False)
    del eager, unchecked
    planned, compile_time, log = _compiled(planned_model, model_file, inputs, autocast)
    result = compare(model_file, settings, baseline_model, planned, inputs, target, repeats, False)
    figures = CompiledFigures(
        compile_time_s=compile_time,
        unchecked_peak_bytes=base.measured_peak_bytes,
        unchecked_step_time_ratio=base.step_time_ratio,
        step_time_ratio=result.step_time_ratio / base.step_time_ratio,
        graphs=log.compiled_graphs,
        graph_breaks=log.graph_breaks,
        unchecked_graphs=plain.compiled_graphs,
        unchecked_graph_breaks=plain.graph_breaks,
    )
    return figures, result
