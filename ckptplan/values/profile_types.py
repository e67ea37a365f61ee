"""What a profile is made of: the settings it was made for, each block's figures, the step's,
its op records and the modules enclosing its blocks. Plain data, importable without torch, so
that the stages reading a profile (the problem, reports, plans) need not import its producer.

``ckptplan.profiling.profiler`` makes them from a traced step; ``ckptplan.profiling.expand``
extrapolates them over repeated blocks; the solvers, reports and plans read them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptplan.values.phase import Phase


@dataclass
class OpRecord:
    """One aten op of the step, as the profile reports it."""

    op: str
    phase: str
    """The label of its ``Phase``."""
    module: str
    backward: bool
    output_bytes: int
    saved_bytes: int
    """Bytes autograd saved between this op and the next (see ``OpRecorder.note_saved``)."""
    flops: float
    time: float
    random: bool
    inplace: bool
    mutated_later: bool = False
    """An in-place op later overwrites this op's output (so it cannot be cached for reuse)."""
    inputs: tuple[int, ...] = ()
    """Indices (in the step's records) of the ops whose outputs this op reads: per tensor
    argument, the latest op that wrote its storage. Parameters, inputs and other tensors made
    outside the recording have no producer and are left out."""
    allocated_bytes: int = 0
    """Bytes of the storages this op brought into being (none for in-place ops and aliases)."""
    overwritten_bytes: int = 0
    """Bytes of recorded ops' storages this op overwrote in place (a new version of them)."""
    moved_bytes: int = 0
    """Bytes of its tensor arguments and outputs: what the roofline's memory side moves."""
    half: bool = False
    """Its outputs are bf16/fp16 (tensor-core math on a GPU)."""
    saved_for_backward: bool = False
    """Autograd saved this op's output (or a view of it) for backward: a value backward needs
    back, kept or recomputed (``ckptplan.planning.compiled_menus``)."""


def block_forward_records(records: Sequence[OpRecord], blocks: int) -> list[list[OpRecord]]:
    """Each of ``blocks`` blocks' forward ops, in the order a selective policy sees them."""
    forward: dict[int, list[OpRecord]] = {}
    for op in records:
        phase = Phase.parse(op.phase)
        if phase.is_forward and phase.block_index is not None and not op.backward:
            forward.setdefault(phase.block_index, []).append(op)
    return [forward.get(i, []) for i in range(blocks)]


def replayed_count(ops: Sequence[OpRecord]) -> int:
    """How many of a block's forward ops its recomputation runs: up to the last one that saves
    a tensor for backward, where recomputation stops once every saved tensor is back."""
    return max((i + 1 for i, op in enumerate(ops) if op.saved_bytes > 0), default=0)


@dataclass(frozen=True)
class EnclosingModule:
    """A module whose one call runs units ``[start, end)`` and, if ``encloses_gap``, the code
    between unit ``end - 1`` and the next (its own code after its blocks)."""

    path: str
    start: int
    end: int
    encloses_gap: bool = False


@dataclass(frozen=True)
class Settings:
    """What the profile was made for; a plan records it."""

    batch_size: int | None = None
    optimizer: str = "adamw"
    dtype: str = "fp32"
    device: str = "cpu"
    blocks: str | None = None
    autocast: str | None = None
    measure: bool = False
    """Time every op on the local device (a real step) instead of the roofline estimate."""
    compiled: bool = False
    """The step runs under ``torch.compile``: priced fused, its peak taken from the partition
    AOTAutograd makes (``ckptplan.stepping.compiled``)."""


@dataclass(frozen=True)
class Gap:
    """The code between a block and the next when the next does not take the block's output
    (a stage's downsampling, a second tower's embedding): absolute live bytes of its forward
    and backward peaks, and the gradient bytes present when its backward starts."""

    fwd_peak: int
    bwd_peak: int | None
    bwd_grads: int = 0
    """What an activations budget takes off ``bwd_peak`` (see ``BlockProfile``)."""
    fwd_start: int = 0
    bwd_start: int | None = None
    bwd_start_grads: int = 0
    """What an activations budget takes off ``bwd_start``."""
    saved_bytes: int = 0
    """Bytes its own ops save for backward (made in the gap; its input and output excluded):
    what checkpointing an enclosing module whole drops from forward."""
    fwd_time: float = 0.0


@dataclass(frozen=True)
class BlockProfile:
    """One block of the chain, measured on the unchecked step (bytes are absolute live bytes)."""

    path: str
    class_name: str
    input_bytes: int
    output_bytes: int
    saved_bytes: int
    input_kept: bool
    joins_previous: bool
    parameter_bytes: int
    fwd_start: int
    fwd_peak: int
    fwd_peak_nograd: int
    bwd_start: int
    bwd_peak: int
    grads_at_bwd_end: int
    flops_fwd: float
    flops_bwd: float
    time_fwd: float
    time_bwd: float
    random: bool = False
    """Its forward draws random numbers (dropout): recompute must replay the RNG state."""
    stateful: bool = False
    """It updates buffers in training (BatchNorm running stats): recompute updates them twice."""
    own_output_bytes: int = 0
    """Bytes of the output that only the block's own backward keeps (a final ReLU saves its
    result): alive at ``bwd_start`` of the unchecked step, but dropped by a checkpointed block,
    whose recomputation makes it again."""
    freed_output_bytes: int = 0
    """Bytes of the output that nothing after the block saves or takes (an average pool's
    input): checkpointed, the block frees its output once the next op has read it, where the
    unchecked step keeps it to the block's backward. A part of ``own_output_bytes``."""
    gap: Gap | None = None
    """The code that runs after this block and before the next, if any."""
    grads_at_bwd_start: int = 0
    """Gradient bytes present when its backward starts: an activations budget takes these off
    ``bwd_start`` (the block's own appear during its backward)."""
    grads_at_bwd_peak: int = 0
    """``bwd_peak`` minus the backward's peak of activations alone (gradients excluded from
    the moment each is accumulated): what an activations budget takes off ``bwd_peak``."""
    trainable_bytes: int | None = None
    """Bytes of its parameters that get gradients (frozen ones, as under LoRA, get none);
    None: all of them."""
    replay_peak: int | None = None
    """The forward's peak up to its last op that saves a tensor, where the recomputation of a
    region ending with this block stops; None: ``fwd_peak``."""

    @property
    def gradient_bytes(self) -> int:
        return self.parameter_bytes if self.trainable_bytes is None else self.trainable_bytes


@dataclass(frozen=True)
class Profile:
    """A model's training step, as the solvers see it."""

    model_name: str
    fingerprint: dict[str, Any]
    inputs: Any
    settings: Settings
    blocks: tuple[BlockProfile, ...]
    parameter_bytes: int
    optimizer_bytes: int
    input_bytes: int
    persistent_bytes: int
    peak_bytes: int
    tail_peaks: tuple[tuple[int, str], ...]
    """(live bytes, ``PeakEvent`` label) of the events between the last block's forward and
    its backward."""
    fixed_peaks: tuple[tuple[int, str], ...]
    """(live bytes, ``PeakEvent`` label) of the events no plan changes."""
    step_time: float
    flops: float
    phases: tuple[tuple[str, int, int], ...] = field(default=())
    """The timeline: (``Phase`` label, live bytes at start, peak) per phase."""
    ops: tuple[OpRecord, ...] = field(default=(), repr=False)
    """Every aten op of the step, forward and backward, in execution order."""
    policy_op_time: float = 0.0
    """Seconds a selective-checkpoint policy adds per op call it sees (its dispatch modes see
    each op of a policied block in forward, and again in recompute)."""
    modules: tuple[tuple[str, str, int], ...] = field(default=(), repr=False)
    """(path, class name, parameter count) of every module, in definition order."""
    notes: tuple[str, ...] = ()
    """What the profiled step does differently from the model's defaults, and why."""

    trainable_bytes: int | None = None
    """Bytes of the parameters that get gradients and optimizer state; None: all of them."""
    event_grads: tuple[tuple[str, int], ...] = ()
    """(``PeakEvent`` label, what an activations budget takes off its peak) of the events
    outside the blocks."""
    enclosures: tuple[EnclosingModule, ...] = ()
    """Modules around runs of blocks that may be checkpointed whole, nested (a stage)."""
    region_state_bytes: int = 0
    """Bytes each checkpointed region keeps outside aten dispatch in the device's memory: the
    CPU RNG state that ``preserve_rng_state`` stashes, when the device is the CPU (on a GPU it
    lies in host memory, and the GPU's own RNG state is a few bytes kept on the host too)."""

    @property
    def gradient_bytes(self) -> int:
        return self.parameter_bytes if self.trainable_bytes is None else self.trainable_bytes
