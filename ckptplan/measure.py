"""Ground truth: run a training step with and without a plan, and compare (DESIGN.md section 9).

Memory is the peak of one steady-state step (forward, backward, optimizer step, the optimizer
state already created): ``torch.cuda.max_memory_allocated`` on CUDA; on CPU the allocator's
own event stream plus the bytes that persist across steps, with the profiler's live-storage
tracker's figure beside it (the fake run, on fake tensors, has only the tracker). Time is
taken in pairs, the candidate's step and the baseline's back to back (in alternating order);
the step-time ratio is the median of the pairs' ratios, so a burst of load on a shared
machine spoils one pair, not the comparison.
Gradients are compared after the same seeded forward and backward, dropout included.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch._inductor import config as inductor_config
from torch._subclasses.fake_tensor import FakeTensorMode

from ckptplan.allocmeter import allocator_peak
from ckptplan.compiled import CompiledModel, Partition, partitioning_backend
from ckptplan.devices import get_device
from ckptplan.errors import CkptplanError, option, raised_by_ckptplan
from ckptplan.fakepaths import real_step_paths
from ckptplan.gpukernels import GpuAttention
from ckptplan.loading import Workload, build_fake, call_model
from ckptplan.memtrack import (
    CompiledStepTracker,
    LiveStorageTracker,
    gradients_counted,
    rng_states_counted,
    storage_bytes,
)
from ckptplan.plan import Plan
from ckptplan.training import (
    autocast_context,
    cast_floating,
    cast_model,
    fits_real_step,
    input_tensors,
    make_optimizer,
    parse_dtype,
    persistent_tensors,
    training_conventions,
)
from ckptplan.workspace import Workspaces
from ckptplan.wrapping import apply


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
        }

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


@dataclass
class _Run:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    inputs: Any
    autocast: str | None = None


def _step(model_file: Workload, run: _Run, seed: int) -> None:
    torch.manual_seed(seed)
    device_type = next(input_tensors(run.inputs), torch.empty(0)).device.type
    with autocast_context(run.autocast, device_type):
        loss = model_file.loss(call_model(run.model, run.inputs))
    loss.backward()
    del loss
    if run.optimizer is not None:
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
    else:
        run.model.zero_grad(set_to_none=True)


def _measured_peak(
    model_file: Workload, run: _Run, device: torch.device, scope: str = "step"
) -> tuple[int, int | None]:
    """Peak bytes of one steady-state step by the device's allocator: CUDA's statistics, or
    on CPU the allocator's event stream (``allocmeter``). In scope ``activations`` without the
    parameters, optimizer state and batch, and on CPU without each gradient from the moment it
    exists (on CUDA the gradients stay in: an upper bound). With it, on CUDA, the peak the
    caching allocator reserved (``max_memory_reserved``, the same bytes taken off)."""
    _step(model_file, run, seed=1)
    persistent = storage_bytes(persistent_tensors(run.model, run.optimizer, run.inputs))
    if device.type == "cuda":
        outside = persistent if scope != "step" else 0
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        _step(model_file, run, seed=2)
        torch.cuda.synchronize(device)
        allocated = torch.cuda.max_memory_allocated(device) - outside
        return allocated, torch.cuda.max_memory_reserved(device) - outside
    peak = allocator_peak(lambda: _step(model_file, run, seed=2), run.model)
    return (peak.activations if scope == "activations" else persistent + peak.step), None


def _tracked_peak(
    model_file: Workload,
    run: _Run,
    scope: str = "step",
    host_memory: bool = True,
    block: int = 1,
    tracker_type: type[LiveStorageTracker] = LiveStorageTracker,
) -> int:
    """The same peak counted by the live-storage tracker the profiler uses (which also runs
    on fake tensors), plus, where the device memory is host memory, the CPU RNG states that
    checkpoints stash outside dispatch."""
    _step(model_file, run, seed=1)
    persistent = persistent_tensors(run.model, run.optimizer, run.inputs)
    workspaces = Workspaces() if host_memory else None
    tracker = tracker_type(persistent, block, workspaces)
    states = rng_states_counted(tracker) if host_memory else nullcontext()
    with tracker, gradients_counted(run.model, tracker), states:
        _step(model_file, run, seed=2)
    if scope == "activations":
        return tracker.activation_peak
    return storage_bytes(persistent) + tracker.peak


def _grads(
    model_file: Workload, model: torch.nn.Module, inputs: Any, autocast: str | None
) -> dict[str, torch.Tensor]:
    torch.manual_seed(1234)
    model.zero_grad(set_to_none=True)
    with autocast_context(autocast, next(input_tensors(inputs)).device.type):
        loss = model_file.loss(call_model(model, inputs))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def _timed(model_file: Workload, run: _Run, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    _step(model_file, run, seed=3)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


@dataclass(frozen=True)
class Comparison:
    measured_peak_bytes: int
    baseline_peak_bytes: int
    step_time_s: float
    baseline_step_time_s: float
    max_grad_abs_diff: float
    step_time_ratio: float
    """Median over the timed pairs of candidate / baseline step time."""
    step_time_ratio_range: tuple[float, float]
    tracked_peak_bytes: int | None = None
    """The candidate's peak by the profiler's live-storage tracker (CPU only)."""
    reserved_peak_bytes: int | None = None
    """The candidate's peak reserved by CUDA's caching allocator (CUDA only)."""


def _paired_times(
    model_file: Workload, runs: dict[str, _Run], target: torch.device, repeats: int
) -> dict[str, list[float]]:
    """Step times of ``runs`` in ``repeats`` back-to-back rounds, the order alternating."""
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeats):
        for name in names if i % 2 == 0 else reversed(names):
            times[name].append(_timed(model_file, runs[name], target))
    return times


def _pair_ratios(times: dict[str, list[float]]) -> list[float]:
    """Candidate / baseline step time of each back-to-back pair."""
    return [c / b for c, b in zip(times["candidate"], times["baseline"], strict=True)]


def _compare(
    model_file: Workload,
    settings: dict[str, Any],
    baseline_model: torch.nn.Module,
    candidate: torch.nn.Module,
    inputs: Any,
    target: torch.device,
    repeats: int,
    track: bool = True,
) -> Comparison:
    """Gradients, steady-state peak and median step time of ``candidate`` against the baseline
    (and on the CPU with ``track``, its peak by the live-storage tracker too)."""
    autocast = settings.get("autocast")
    reference = _grads(model_file, baseline_model, inputs, autocast)
    got = _grads(model_file, candidate, inputs, autocast)
    max_diff = max(
        ((reference[n].float() - got[n].float()).abs().max().item() for n in reference),
        default=0.0,
    )
    del reference, got
    optimizer_name = settings.get("optimizer", "adamw")
    runs = {
        name: _Run(model, make_optimizer(optimizer_name, model), inputs, autocast)
        for name, model in (("baseline", baseline_model), ("candidate", candidate))
    }
    scope = settings.get("scope", "step")
    peaks = {name: _measured_peak(model_file, run, target, scope) for name, run in runs.items()}
    tracked = (
        _tracked_peak(model_file, runs["candidate"], scope)
        if target.type == "cpu" and track
        else None
    )
    times = _paired_times(model_file, runs, target, repeats)
    ratios = _pair_ratios(times)
    return Comparison(
        measured_peak_bytes=peaks["candidate"][0],
        baseline_peak_bytes=peaks["baseline"][0],
        tracked_peak_bytes=tracked,
        reserved_peak_bytes=peaks["candidate"][1],
        step_time_s=statistics.median(times["candidate"]),
        baseline_step_time_s=statistics.median(times["baseline"]),
        max_grad_abs_diff=max_diff,
        step_time_ratio=statistics.median(ratios),
        step_time_ratio_range=(min(ratios), max(ratios)),
    )


def _baseline(
    model_file: Workload, settings: dict[str, Any], target: torch.device
) -> tuple[torch.nn.Module, Any, torch.dtype]:
    dtype = parse_dtype(settings.get("dtype", "fp32"))
    torch.manual_seed(0)
    model = model_file.build()
    torch.manual_seed(0)
    inputs, _ = training_conventions(model, model_file.inputs(settings.get("batch_size")))
    model = cast_model(model, dtype).to(device=target).train()
    return model, cast_floating(_to_device(inputs, target), dtype), dtype


def run_device(device: str | None) -> torch.device:
    """The local device a measurement runs on (default: CUDA where present, else the CPU),
    refused in one line where this machine or this torch build has no such device."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        target = torch.device(device)
    except RuntimeError:
        raise CkptplanError(f"{device!r} is not a device; e.g. cpu, cuda or cuda:1") from None
    if target.type == "cuda":
        if not torch.cuda.is_available():
            build = "has no CUDA (a CPU build)" if torch.version.cuda is None else "sees no GPU"
            raise CkptplanError(f"device {device}: this torch {build}; measure on cpu")
        if target.index is not None and target.index >= torch.cuda.device_count():
            raise CkptplanError(
                f"device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    elif target.type != "cpu":
        raise CkptplanError(f"device {device}: ckptplan measures on cpu or cuda devices")
    return target


def _check_repeats(repeats: int) -> None:
    if repeats < 1:
        raise CkptplanError(f"{repeats} repeats: time at least one step of each (e.g. 3)")


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


def _compiled(
    model: torch.nn.Module, model_file: Workload, inputs: Any, autocast: str | None
) -> tuple[torch.nn.Module, float]:
    """``model`` compiled by inductor, and the seconds its first step took over its second."""
    compiled = CompiledModel(model, "inductor")
    times = []
    for _ in range(2):
        start = time.perf_counter()
        _grads(model_file, compiled, inputs, autocast)
        times.append(time.perf_counter() - start)
    return compiled, max(times[0] - times[1], 0.0)


def verify_plan(
    model_file: Workload,
    plan: Plan,
    device: str | None = None,
    repeats: int = 3,
    force: bool = False,
) -> Verification:
    """Measure the plan's step against the unchecked step of the same model and batch."""
    _check_repeats(repeats)
    target = run_device(device)
    kind = plan.settings.get("device", "cpu")
    if (kind == "cpu") != (target.type == "cpu") and not force:
        on = option("run_on", "cuda" if kind != "cpu" else "cpu")
        where = f"a CUDA GPU ({on})" if kind != "cpu" else f"the CPU ({on})"
        again = option("target", "cpu" if target.type == "cpu" else "h100")
        raise CkptplanError(
            f"the plan was made for {kind} and predicts that device's memory; verify it on "
            f"{where}, solve again with {again}, or pass {option('force', True)} to measure it "
            "here anyway"
        )
    baseline_model, inputs, dtype = _baseline(model_file, plan.settings, target)
    planned_model = apply(copy.deepcopy(baseline_model), plan, force=force)
    compiled = None
    if plan.settings.get("compiled"):
        # Inductor draws its own dropout masks unless told to use eager's: with eager's, the
        # compiled plan's gradients compare seed for seed with the eager step's.
        with inductor_config.patch(fallback_random=True):
            compiled, result = _compare_compiled(
                model_file, plan.settings, baseline_model, planned_model, inputs, target, repeats
            )
    else:
        result = _compare(
            model_file, plan.settings, baseline_model, planned_model, inputs, target, repeats
        )
    predicted = plan.predicted.get("fake_run_peak_bytes") if compiled else None
    return Verification(
        device=str(target),
        budget_bytes=int(plan.budget["bytes"]),
        predicted_peak_bytes=int(predicted or plan.predicted["peak_bytes"]),
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
        predicted_overhead=plan.predicted.get("overhead"),
        reserved_peak_bytes=result.reserved_peak_bytes,
        compiled=compiled,
    )


def _compare_compiled(
    model_file: Workload,
    settings: dict[str, Any],
    baseline_model: torch.nn.Module,
    planned_model: torch.nn.Module,
    inputs: Any,
    target: torch.device,
    repeats: int,
) -> tuple[CompiledFigures, Comparison]:
    """The planned model compiled against the eager baseline, and the compiled unchecked model
    against it too. The live-storage tracker cannot follow inductor's kernels: the allocator's
    figure alone."""
    autocast = settings.get("autocast")
    # Each comparison trains its pair: the compiled unchecked model's has its own eager copy.
    eager = copy.deepcopy(baseline_model)
    unchecked, _ = _compiled(copy.deepcopy(baseline_model), model_file, inputs, autocast)
    base = _compare(model_file, settings, eager, unchecked, inputs, target, repeats, False)
    del eager, unchecked
    planned, compile_time = _compiled(planned_model, model_file, inputs, autocast)
    result = _compare(model_file, settings, baseline_model, planned, inputs, target, repeats, False)
    figures = CompiledFigures(
        compile_time_s=compile_time,
        unchecked_peak_bytes=base.measured_peak_bytes,
        unchecked_step_time_ratio=base.step_time_ratio,
        step_time_ratio=result.step_time_ratio / base.step_time_ratio,
    )
    return figures, result


def interleaved_step_times(
    model_file: Workload, plans: dict[str, Plan], repeats: int = 9
) -> dict[str, list[float]]:
    """Step times of the model under each of ``plans`` (made for the same model and batch) on
    this CPU, in ``repeats`` interleaved rounds, so that two plans are compared in one process
    under the same conditions (``benchmarks/auto_vs_dp.py``); round ``i``'s times are pairs."""
    _check_repeats(repeats)
    target = torch.device("cpu")
    settings = next(iter(plans.values())).settings
    baseline_model, inputs, _ = _baseline(model_file, settings, target)
    optimizer = settings.get("optimizer", "adamw")
    runs = {}
    for name, plan in plans.items():
        model = apply(copy.deepcopy(baseline_model), plan)
        runs[name] = _Run(model, make_optimizer(optimizer, model), inputs, settings.get("autocast"))
    for run in runs.values():  # warm-up: optimizer state, allocator pools
        _timed(model_file, run, target)
    return _paired_times(model_file, runs, target, repeats)


class _Partitioned(torch.nn.Module):
    """``model`` traced by AOTAutograd, its backward split off by ``partition_fn``.

    Like ``aot_module``, but parameters and buffers go in once each, by their first names, so
    tied weights (a GPT's head and embedding) stay one tensor; ``functional_call`` ties them
    back. ``named_parameters`` are the model's own, so gradients compare name by name.
    """

    def __init__(self, model: torch.nn.Module, partition_fn: Any) -> None:
        from functorch.compile import aot_function, nop

        super().__init__()
        self.model = model
        self.params = dict(model.named_parameters())
        self.buffers_ = dict(model.named_buffers())

        def step(state: dict[str, torch.Tensor], *args: Any, **kwargs: Any) -> Any:
            return torch.func.functional_call(model, state, args, kwargs)

        self.compiled = aot_function(
            step, fw_compiler=nop, bw_compiler=nop, partition_fn=partition_fn
        )

    def named_parameters(self, *args: Any, **kwargs: Any) -> Any:
        yield from self.model.named_parameters(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled({**self.params, **self.buffers_}, *args, **kwargs)


def measure_change(
    model_file: Workload,
    settings: dict[str, Any],
    change: Callable[[torch.nn.Module], torch.nn.Module],
    device: str | None = None,
    repeats: int = 3,
) -> Comparison:
    """A peer strategy measured like a plan: ``change`` turns a copy of the model into the
    candidate (Hugging Face's ``gradient_checkpointing_enable``, a hand-written wrapper), and
    the candidate's peak, time and gradients are compared with the unchanged model's."""
    target = run_device(device)
    baseline_model, inputs, _ = _baseline(model_file, settings, target)
    candidate = change(copy.deepcopy(baseline_model))
    return _compare(model_file, settings, baseline_model, candidate, inputs, target, repeats)


def measure_compile_budget(
    model_file: Workload,
    settings: dict[str, Any],
    memory_budget: float,
    device: str | None = None,
    repeats: int = 3,
) -> Comparison:
    """``torch.compile``'s ``activation_memory_budget`` peer, measured like a plan.

    AOTAutograd's min-cut partitioner chooses what to recompute under the budget; it runs here
    through ``aot_function`` with eager (nop) compilers, the partitioning ``torch.compile``
    applies, without dynamo, so the live-storage tracker can count the compiled step.
    """
    from functorch.compile import min_cut_rematerialization_partition
    from torch._functorch import config as functorch_config

    target = run_device(device)
    baseline_model, inputs, _ = _baseline(model_file, settings, target)
    with functorch_config.patch(activation_memory_budget=memory_budget):
        candidate = _Partitioned(copy.deepcopy(baseline_model), min_cut_rematerialization_partition)
        return _compare(model_file, settings, baseline_model, candidate, inputs, target, repeats)


def fake_run_peak(model_file: Workload, plan: Plan) -> int:
    """The plan's steady-state step peak, executed under ``FakeTensorMode``: nothing allocated.

    This runs the real checkpointed code (``apply``, ``torch.utils.checkpoint``) and counts
    live storages, so it confirms the chain model's prediction without a device. A plan made
    for ``torch.compile`` runs compiled (``compiled_fake_run``).
    """
    if plan.settings.get("compiled"):
        return compiled_fake_run(model_file, plan)[0]
    try:
        return _checkpointed_step_peak(model_file, plan, real=False)
    except CkptplanError:
        raise
    except Exception as exc:
        # The profile took a real step for such a model; a real error shows again there.
        size = 4 * int(plan.fingerprint.get("parameters", 0))
        if raised_by_ckptplan(exc) or not fits_real_step(size):
            raise
        return _checkpointed_step_peak(model_file, plan, real=True)


def compiled_fake_run(model_file: Workload, plan: Plan) -> tuple[int, Partition]:
    """The step peak of ``torch.compile`` after ``apply(model, plan)`` (a plan of no regions:
    the unchecked model), and the partition it made, on fake tensors: inductor's decompositions and
    partitioner with eager kernels (``ckptplan.compiled``). The caller's own compiled code is
    left as it was (Note [compiling without touching the caller's caches]).
    """
    log = Partition()
    peak = _checkpointed_step_peak(model_file, plan, real=False, compiled=log)
    return peak, log


def _checkpointed_step_peak(
    model_file: Workload,
    plan: Plan,
    real: bool,
    compiled: Partition | None = None,
) -> int:
    """The plan's step peak on fake tensors, or for a step fake tensors cannot run (token
    routing) a real one on this machine's CPU, as the profile then took. With ``compiled``,
    the step runs ``torch.compile``d, its partition written there."""
    settings = plan.settings
    dtype = parse_dtype(settings.get("dtype", "fp32"))
    with nullcontext() if real else FakeTensorMode(allow_non_fake_inputs=True):
        torch.manual_seed(0)
        model = model_file.build() if real else build_fake(model_file)
        inputs, _ = training_conventions(model, model_file.inputs(settings.get("batch_size")))
        model = cast_model(model, dtype).train()
        apply(model, plan, force=True)
        inputs = cast_floating(inputs, dtype)
        optimizer = make_optimizer(settings.get("optimizer", "adamw"), model)
        if compiled is not None:
            model = CompiledModel(model, partitioning_backend(compiled))
        run = _Run(model, optimizer, inputs, settings.get("autocast"))
        target = get_device(settings.get("device", "cpu"))
        host = not target.host_bandwidth
        kernels = GpuAttention() if not host and not real else nullcontext()
        with real_step_paths(inputs, compiled is not None), kernels:
            scope = settings.get("scope", "step")
            if real:  # a real step here: the allocator's own figure, as verify takes it
                return _measured_peak(model_file, run, torch.device("cpu"), scope)[0]
            tracker = LiveStorageTracker if compiled is None else CompiledStepTracker
            return _tracked_peak(model_file, run, scope, host, target.allocation_block, tracker)


def _to_device(tree: Any, device: torch.device) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, tuple | list):
        return type(tree)(_to_device(t, device) for t in tree)
    if isinstance(tree, dict):
        return {k: _to_device(v, device) for k, v in tree.items()}
    return tree
