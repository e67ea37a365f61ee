"""Roofline figures of the devices ckptplan can estimate time for, without running there.

An op's time is its launch cost plus ``max(FLOPs / achieved FLOP/s, bytes moved / achieved
bandwidth)``, where "achieved" is the vendor's dense peak times the share of it that op's class
reaches (``Efficiency``). ``host_bandwidth`` is what one direction of the host link (PCIe)
sustains, the price of offloading a saved tensor to host memory and back; a CPU has no host to
offload to.

Note [where the GPU efficiencies come from]
    Published measurements, rounded down: large bf16 GEMMs in cuBLAS reach 70-80% of the dense
    tensor-core peak on A100 and H100 (NVIDIA's own GEMM benchmarks; MLPerf training MFUs of
    40-55% include everything else). FlashAttention-2 reports 50-73% of the A100 peak in
    forward and less in backward; FlashAttention-3 about 75% of the H100's in forward, so one
    figure of 50% covers both passes. Memory-bound kernels (pointwise, norms, softmax) stream at
    80-90% of HBM peak (STREAM-like copy kernels). A kernel launched from eager PyTorch costs
    its host about 4-10 µs; most of that hides behind the previous kernel, but short kernels
    are launch-bound, so each op pays 4 µs.

Note [where the CPU figures come from]
    Fitted, not quoted: ``benchmarks/calibrate_cpu.py`` times every op of the sample models'
    steps on this project's 2-core reference machine (one thread) and fits the four figures to
    the measured times; its result is in ``benchmarks/results/cpu_calibration.json``. The
    half-precision rate is not fitted (the samples train in fp32): half the fp32 rate. Nor is
    attention's, which no sample calls: ``benchmarks/attention_rate.py`` measures it apart. What a
    plan's overhead depends on is the ratio of recomputed to total time, which a faster or
    slower CPU of the same kind scales alike. ``--measure`` times the ops on the machine itself.

Note [pricing a compiled step]
    Under ``torch.compile`` inductor fuses chains of pointwise and reduction ops into one
    kernel: a fused op reads what its producer left in registers and launches nothing of its
    own, so its share of the kernel's traffic is about its output, half of the bytes it moves
    in eager mode. Matmuls and attention stay library calls. A selective policy is applied at
    trace time (its tags go to the partitioner), so it costs no time per op call and needs no
    margin to pay for itself (``Device.compiled``).

    The fake run of a compiled step executes inductor's partition (``stepping.compiled``): its
    saved tensors are inductor's own, and what each graph holds while it runs is inductor's own
    memory lines, replayed (``stepping.inductor_memory``), with library kernels' buffers measured
    apart. On the ViT sample's selective plans that matches the CPU allocator to bytes where op
    by op eager kernels were up to 9% under; on GPT and UNet plans it is up to 9% over
    (``benchmarks/compiled_accuracy.py``), never under. The lines are those of the backend
    that lowers here (the CPU's), so for a GPU target they are an approximation. A compiled
    plan holds back at least 1% of its budget (a GPU's own margin is larger).

Note [when offload pays]
    A selective policy may offload a saved tensor: copy it to pinned host memory in forward and
    back in backward, instead of keeping or recomputing it. Each direction is one copy that the
    policy's dispatch mode starts from Python (``applying/offload.py``: a pinned buffer from
    torch's caching host allocator, ``copy_(non_blocking=True)``; back, one ``.to(device)``),
    so besides its bytes over the host link a copy pays a fixed cost, a launch as a kernel's
    (4-10 µs from eager PyTorch) and the mode's Python: 10 µs (``Efficiency.copy``). A copy
    is worth starting only where its bytes, not that fixed cost, take the time: from
    ``host_bandwidth * copy`` bytes up (``Device.least_offload_bytes``: 500 KB on a 50 GB/s
    PCIe 5 link, 250 KB on PCIe 4). Below that, offload is not offered at all: the memory it
    would free is a few kilobytes, under the budget's margin and the CUDA caching allocator's
    small-block pool (blocks up to 1 MiB share 2 MiB segments, so freeing one rarely returns
    memory), and it would add two synchronising copies per tensor for it. That is what H100
    plans did when a copy was priced by its bytes alone: offloaded 0.8-8.6 MiB of norm
    statistics (16 KiB per ``mean.dim`` of a Llama layer). Above it, a tensor is offloaded
    where the round trip, fixed cost included, is cheaper than recomputing it: in practice
    the output of a matmul or attention, as a pointwise op or a norm recomputes from HBM 12 to
    160 times faster than PCIe moves it on the targets here. ``--no-offload``
    (``offload=False``) turns offload off whatever it would save.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from ckptplan.deprecation import deprecated
from ckptplan.errors import CkptplanError, option

OpKind = Literal["matmul", "attention", "memory", "random"]
"""Which roofline an op runs against: GEMM/convolution units, attention kernels, memory, or
memory at the rate a random-number kernel fills it (dropout's masks: the CPU's generator is
several times slower than its memory)."""

_MATMUL_OPS = frozenset(
    ("mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "convolution", "_convolution")
)


def op_kind(name: str) -> OpKind:
    """The class of an aten op by its name (``aten.addmm.default`` -> ``"matmul"``).

    >>> op_kind("aten.convolution_backward.default"), op_kind("aten.gelu.default")
    ('matmul', 'memory')
    """
    base = name.split(".")[1] if name.startswith("aten.") else name.split(".")[0]
    if "attention" in base:
        return "attention"
    if base in _MATMUL_OPS or "convolution" in base:
        return "matmul"
    return "memory"


@dataclass(frozen=True)
class Efficiency:
    """Share of the vendor peak each op class achieves, and the fixed cost of one op call."""

    matmul: float = 0.7
    attention: float = 0.5
    memory: float = 0.8
    random: float = 0.8
    """Share of memory bandwidth a kernel drawing random numbers streams at."""
    launch: float = 4e-6
    """Seconds each op call costs beyond its roofline time (kernel launch, dispatch)."""
    copy: float = 10e-6
    """Seconds each copy to or from host memory costs beyond its bytes' time over the link
    (Note [when offload pays])."""
    stall: float = 0.0
    """Share of a library call's bytes from memory (not the cache) whose time its FLOPs do not
    hide, where a compiled graph's cache is modelled (Note [recompute reads from cache] in
    ``ckptplan.stepping.kernelcost``): a CPU GEMM packs its operands in a pass of its own. 0
    on GPUs, whose GEMMs stream operands while they multiply, until measured."""
    write_allocate: float = 0.0
    """Share of a compiled pointwise kernel's bytes written to a fresh buffer (an output of
    its graph: a saved value, a gradient) it moves again, where a compiled graph's cache is
    modelled (Note [a fresh buffer is read before it is written] in
    ``ckptplan.stepping.kernelcost``): a CPU fetches a line before it writes it. 0 on GPUs,
    whose caches take a whole written line without fetching it."""


@dataclass(frozen=True)
class Device:
    name: str
    fp32_flops: float
    half_flops: float
    """Peak FLOP/s for bf16/fp16 tensor-core math."""
    bandwidth: float
    """Memory bandwidth in bytes per second."""
    host_bandwidth: float = 0.0
    """Bytes per second to and from host memory; 0 where the device memory is host memory."""
    efficiency: Efficiency = field(default_factory=Efficiency)
    policy_op_time: float = 0.0
    """Seconds a selective-checkpoint policy adds per op call: host time in its Python
    dispatch modes. On a GPU the host runs ahead of kernels long enough to need checkpointing,
    so it hides there (0); on a CPU it is paid in line. ``--measure`` measures it."""

    selective_slack: float = 0.0
    """Share of the step a selective plan must be predicted to save over the segments-only
    plan for the same budget before ``auto`` takes it (see Note [why selective plans must win
    by a slack] in ``ckptplan.planning.search``). On a GPU the policy's host time hides behind
    kernels: any predicted gain counts. (Was ``selective_margin``: "margin" is the budget
    held back.)"""

    margin_percent: float = 3.0
    """Percent of the budget a plan holds back by default (``--margin``). On a GPU the
    caching allocator rounds blocks and fragments, which the prediction does not model yet.
    On the CPU the fake run executes the plan's own checkpoint code and matches the
    allocator's own figure but for scalars made outside dispatch (an optimizer's wrapped
    numbers, 8 bytes each): 0.1% covers them."""

    allocation_block: int = 512
    """Bytes every allocation is rounded up to, as the budgeted figure counts them: CUDA's
    caching allocator hands out 512-byte multiples (``max_memory_allocated`` counts them so);
    the CPU allocator's live bytes are the tensors' own."""

    fused: bool = False
    """Price the step as ``torch.compile`` runs it (see Note [pricing a compiled step])."""

    cache_bytes: int = 0
    """Bytes of on-chip cache a compiled kernel's reads are served from when they were written
    or read that recently (Note [recompute reads from cache] in
    ``ckptplan.stepping.kernelcost``)."""
    cache_bandwidth: float = 0.0
    """Bytes per second the cache serves them at."""

    def compiled(self) -> Device:
        """This device running a ``torch.compile``d step."""
        return replace(
            self,
            fused=True,
            policy_op_time=0.0,
            selective_slack=0.0,
            margin_percent=max(self.margin_percent, 1.0),
        )

    @property
    def selective_margin(self) -> float:
        """The old name of ``selective_slack``."""
        deprecated("Device.selective_margin", "Device.selective_slack")
        return self.selective_slack

    def op_time(
        self,
        kind: OpKind,
        flops: float,
        bytes_moved: float,
        half: bool,
        cached: float | None = None,
    ) -> float:
        """Seconds one op takes here; ``cached``: how many of its bytes the cache serves, None
        where that is not known (an eager op, whose fitted rates absorb the cache). Where it is
        known, a library call also pays ``efficiency.stall`` of its other bytes' time on top of
        its FLOPs.

        >>> get_device("h100").op_time("matmul", 2 * 4096**3, 3 * 2 * 4096**2, half=True)
        0.000202...
        >>> cpu, flops, moved = get_device("cpu"), 2 * 1024**3, 3 * 4 * 1024**2
        >>> [round(cpu.op_time("matmul", flops, moved, False, hit) * 1e3, 2)
        ...  for hit in (None, moved, 0)]  # eager, operands just written, all from memory
        [14.51, 14.51, 15.81]
        """
        share = self.efficiency
        compute = 0.0
        if kind in ("matmul", "attention"):
            peak = self.half_flops if half else self.fp32_flops
            compute = flops / (peak * (share.matmul if kind == "matmul" else share.attention))
        stream = self.bandwidth * (share.random if kind == "random" else share.memory)
        if self.fused and kind == "memory":
            return bytes_moved / (2 * stream)
        moving = bytes_moved / stream
        if cached and kind != "random":  # a random kernel runs at its generator's rate
            from_cache = self.cache_bandwidth * share.memory
            moving = (bytes_moved - cached) / stream + cached / from_cache
        if cached is not None and kind in ("matmul", "attention"):
            compute += share.stall * (bytes_moved - cached) / stream
        return share.launch + max(compute, moving)

    @property
    def least_offload_bytes(self) -> float:
        """The least tensor worth a copy to host memory (Note [when offload pays])."""
        return self.host_bandwidth * self.efficiency.copy

    def offload_time(self, nbytes: int) -> float | None:
        """Time to copy ``nbytes`` to host memory and back, each copy's fixed cost included;
        None where offload is not offered: no host, or fewer bytes than a copy is worth
        (Note [when offload pays]).

        >>> h100 = get_device("h100")
        >>> h100.offload_time(16 * 2**10), round(h100.offload_time(2**20) * 1e6, 1)
        (None, 61.9)
        """
        if not self.host_bandwidth or nbytes < self.least_offload_bytes:
            return None
        return 2 * (self.efficiency.copy + nbytes / self.host_bandwidth)


CPU_EFFICIENCY = Efficiency(
    matmul=1.0, attention=0.7, memory=1.0, random=0.146, launch=0.0, stall=1.0, write_allocate=0.9
)
"""The reference CPU's figures are fitted achieved rates already (see the note above): memory
streams at 9.7 GB/s, a random-number kernel fills it at 1.4 GB/s; the fit drove the cost per op
call to zero (an op's own overhead is in its measured time). No sample model calls the CPU's
fused attention, so the fit cannot see it: ``benchmarks/attention_rate.py`` times it at the HF
benchmark models' shapes, at 0.68-0.73 of their linear layers' matmul rate in both directions
(two runs), so 0.7. Where a compiled graph's cache is modelled, a library call's bytes from
memory stall it for their whole time: ``benchmarks/cache_reuse.py`` measured 1.0-1.4 times
(medians of four runs) on the linear layers of the HF Llama and ViT benchmark models, and a
write to a buffer in memory at 0.88-1.11 of its bytes' time more than to one just written
(two runs)."""

# A GPU's cache is half its L2, Note [recompute reads from cache].
DEVICES = {
    d.name: d
    for d in (
        Device(
            "h100",
            67e12,
            989e12,
            3.35e12,
            host_bandwidth=50e9,
            cache_bytes=25 * 2**20,
            cache_bandwidth=6.7e12,
        ),
        Device(
            "h200",
            67e12,
            989e12,
            4.8e12,
            host_bandwidth=50e9,
            cache_bytes=25 * 2**20,
            cache_bandwidth=6.7e12,
        ),
        Device("b200", 80e12, 2250e12, 8.0e12, host_bandwidth=50e9),
        Device(
            "a100",
            19.5e12,
            312e12,
            2.0e12,
            host_bandwidth=25e9,
            cache_bytes=20 * 2**20,
            cache_bandwidth=4e12,
        ),
        Device("l4", 30e12, 121e12, 0.3e12, host_bandwidth=25e9),
        Device("rtx4090", 82.6e12, 165e12, 1.0e12, host_bandwidth=25e9),
        Device(
            "cpu",
            1.48e11,
            0.74e11,
            9.7e9,
            efficiency=CPU_EFFICIENCY,
            policy_op_time=45e-6,
            selective_slack=0.03,
            margin_percent=0.1,
            allocation_block=1,
            cache_bytes=64 * 2**20,
            cache_bandwidth=2.1 * 9.7e9,
        ),
    )
}


def get_device(name: str, compiled: bool = False) -> Device:
    """The device called ``name``; ``compiled``: running a ``torch.compile``d step.

    >>> get_device("h100", compiled=True).fused
    True
    """
    try:
        device = DEVICES[name.lower()]
    except KeyError:
        raise CkptplanError(
            f"unknown device {name!r}; choose one of {', '.join(DEVICES)}"
        ) from None
    return device.compiled() if compiled else device


def held_back_percent(percent: float | None, target: str, compiled: bool = False) -> float:
    """The percent of a budget a plan holds back (``--margin``): ``percent``, or the target's
    default when None (``Device.margin_percent``); a value outside [0, 50) is refused.

    >>> held_back_percent(None, "cpu"), held_back_percent(None, "h100"), held_back_percent(2, "cpu")
    (0.1, 3.0, 2)
    """
    if percent is None:
        return get_device(target, compiled).margin_percent
    if not 0 <= percent < 50:
        example = option("margin", 2)
        raise CkptplanError(
            f"{option('margin', percent)} is not a percentage in [0, 50); e.g. {example}"
        )
    return percent
