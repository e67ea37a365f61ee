"""A compiled graph's kernels on the roofline, one by one: what each moves, what of it the
cache serves, and its seconds (``ckptplan.stepping.graphcost`` adds them up per graph;
``benchmarks/kernel_prices.py`` times each where it runs, beside its price).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ckptplan.devices import Device, OpKind


@dataclass(frozen=True)
class Kernel:
    """One kernel of a compiled graph, as the roofline prices it."""

    kind: OpKind
    flops: float
    moved: int
    """Bytes the kernel reads from memory and writes to it."""
    half: bool
    reads: tuple[tuple[str, int], ...] = ()
    """The buffers among ``moved`` it reads, by name, with their bytes."""
    writes: tuple[tuple[str, int], ...] = ()
    """The buffers among ``moved`` it writes."""
    kept: frozenset[str] = frozenset()
    """Those of ``writes`` that outlive the graph (its outputs: saved values, gradients)."""


def kernel_seconds(kernels: Sequence[Kernel], device: Device) -> list[float]:
    """The seconds of each of a graph's ``kernels``, in order, on ``device``'s roofline, the
    cache serving what ``cached_bytes`` says it does and a pointwise kernel's writes to fresh
    buffers fetching them first (``benchmarks/kernel_prices.py`` times them one by one where
    they run).

    >>> from ckptplan.devices import get_device
    >>> def write(kept):  # a pointwise kernel that writes 1 MB, to an output or a temporary
    ...     return Kernel("memory", 0, 10**6, False, (), (("y", 10**6),), frozenset(kept))
    >>> cpu, h100 = get_device("cpu", compiled=True), get_device("h100", compiled=True)
    >>> [round(kernel_seconds([write(kept)], cpu)[0] * 1e6) for kept in ((), ("y",))]
    [103, 196]
    >>> kernel_seconds([write(("y",))], h100) == kernel_seconds([write(())], h100)
    True
    """
    roofline = replace(device, fused=False)  # fusion is modelled here, kernel by kernel
    cached = cached_bytes(kernels, device.cache_bytes)
    allocate = device.efficiency.write_allocate if device.cache_bytes else 0.0
    seconds = []
    for kernel, hit in zip(kernels, cached, strict=True):
        moved = kernel.moved
        if kernel.kind == "memory":  # Note [a fresh buffer is read before it is written]
            moved += int(allocate * sum(b for n, b in kernel.writes if n in kernel.kept))
        seconds.append(
            roofline.op_time(kernel.kind, kernel.flops, moved, kernel.half, min(hit, moved))
        )
    return seconds


def cached_bytes(kernels: Sequence[Kernel], cache: int) -> list[int]:
    """Per kernel, the bytes it moves that a cache of ``cache`` bytes serves (Note [recompute
    reads from cache]): a read of a buffer touched (written or read) by a kernel fewer than
    ``cache`` bytes of traffic before, and a library call's write of a buffer that no kernel
    reads from further away and that dies with the graph. A pointwise kernel's writes always
    reach memory (Note [a written line goes back to memory]).

    >>> def kernel(kind, reads, writes, kept=()):
    ...     moved = sum(b for _, b in reads + writes)
    ...     return Kernel(kind, 0, moved, False, reads, writes, frozenset(kept))
    >>> norm = kernel("memory", (("x", 4),), (("y", 4),))
    >>> matmul = kernel("matmul", (("x", 4),), (("y", 4),))
    >>> grad = kernel("memory", (("y", 4),), (("g", 4),), kept=("g",))
    >>> cached_bytes([norm, grad], cache=16), cached_bytes([matmul, grad], cache=16)
    ([0, 4], [4, 4])
    >>> cached_bytes([norm, norm], cache=0)
    [0, 0]
    """
    hits = [0] * len(kernels)
    touched: dict[str, int] = {}  # buffer -> the traffic up to its last touch
    written: dict[str, tuple[int, int]] = {}  # buffer -> (its writer, its bytes)
    far: set[str] = set()  # buffers some kernel read from memory, not from the cache
    traffic = 0
    for i, kernel in enumerate(kernels):
        for name, size in kernel.reads:
            if name in touched and traffic - touched[name] + size <= cache:
                hits[i] += size
            else:
                far.add(name)
        traffic += kernel.moved
        for name, _ in kernel.reads:
            touched[name] = traffic
        for name, size in kernel.writes:
            touched[name] = traffic
            if kernel.kind != "memory" and name not in kernel.kept and size <= cache:
                written[name] = (i, size)
    for name, (writer, size) in written.items():
        if name not in far:
            hits[writer] += size
    return hits


# Note [recompute reads from cache]
#     A value saved in forward is written to memory and read back in backward, a whole
#     graph later; a value recomputed in backward is written and read by the next kernels,
#     while it is still in the cache, and dies there. So the roofline prices a kernel's read
#     at the cache's bandwidth where the buffer was written or read less than the cache's
#     size of traffic before (its bytes included), and a library call's write so too where
#     the value dies in the graph and no kernel reads it from further away; a pointwise
#     kernel's writes (Note [a written line goes back to memory]) and a graph's inputs and
#     outputs (saved values, gradients) move at memory's. ``benchmarks/cache_reuse.py``
#     measures the CPU's figures on one thread: a buffer just written read 2.1 times as fast
#     as a cold one up to 32 MiB (64 MiB counting the buffer written), so the CPU's cache is
#     64 MiB at 2.1 times its fitted bandwidth. For GPUs, from vendors' and microbenchmark
#     figures: half the L2 (H100's is split in two partitions), at about twice HBM's
#     bandwidth on A100 and 6.7 TB/s on Hopper; other GPUs get no cache credit until
#     measured. ``benchmarks/kernel_prices.py`` holds the prices kernel by kernel against
#     the kernels' own times where they run.
#
#     A library call gains from the cache too, which max(FLOPs, bytes) cannot show: a
#     compute-bound matmul cost the same whatever it read. On the CPU a GEMM packs its
#     operands into blocks in a pass of its own before it multiplies them, so the time of the
#     bytes it moves from memory adds to its FLOPs' time, while those the cache serves hide
#     (``Efficiency.stall``). ``cache_reuse.py`` times the matmuls of the HF benchmark models'
#     linear layers (forward and both gradients) with every operand just written and with
#     every operand in memory: the cold call adds 1.0-1.4 times its bytes' time at the cold
#     bandwidth (the median of nine matmuls, in three runs; 1.4 in a fourth), so the CPU's
#     stall is 1.0. Kernel profiles had shown the effect without it: HF ViT's 0.7 plan reads
#     64 MB less from memory in its matmuls than the unchecked step and they ran 12 ms faster
#     at 1 ms more FLOPs; the Llama plan's recomputed matmuls read 94 MB less and ran 18 ms
#     under their FLOPs' price (the stall now takes 10 ms off it). Neither was used to set
#     the figure.
#     A GPU's GEMMs stream their operands while they multiply: no stall until measured.


# Note [a written line goes back to memory]
#     A cache holds lines, not values: a line a kernel wrote is written back to memory when
#     it is evicted, whether or not a later kernel read it from the cache first and the value
#     died since. A pointwise kernel's time is its traffic, so it pays for its writes at
#     memory's bandwidth; a library call's write-back hides behind its FLOPs, and what it
#     stalls on is its operands (Note [recompute reads from cache]). It shows where a plan
#     recomputes a value inside a backward kernel that also writes it for a matmul to read:
#     HF Llama's SiLU-gate backward kernel, which writes the recomputed product beside the
#     two gradients, ran 1.29 ms a call against the unchecked step's 0.85 ms with the same
#     reads, where crediting the cache for that write priced the difference at 0.04 ms.
#     ``benchmarks/kernel_prices.py`` times every kernel where it runs, beside its price
#     (one thread; graphs' time over the unchecked step's). Before writes to fresh buffers
#     were priced (Note [a fresh buffer is read before it is written]), HF Llama's ``dp`` plans at
#     60/75/90% measured +21.3/+13.9/+6.1% and are priced +21.5/+12.4/+5.6%, HF ViT's
#     +12.7/+9.3/+4.3% and +13.3/+8.5/+3.8%. Kernel by kernel, the pointwise kernels' prices
#     are off by 0.36 (Llama) and 0.53 (ViT) in time-weighted |log(price / time)|, the
#     library calls' by 0.08 and 0.14. Timed the same way before (plans at compile's budget
#     points, the optimizer in the denominator), the cache credit for these writes priced four
#     Llama plans' overheads 8-19% under their time and three ViT plans' 6% under to 1% over;
#     without it Llama's read 12% under to 3% over and ViT's 1% under to 7% over, and the
#     pointwise error fell from 0.39 to 0.33 (Llama) and from 0.45 to 0.32 (ViT).


# Note [a fresh buffer is read before it is written]
#     A CPU core writes whole cache lines, but fetches each line before it writes it
#     (write-allocate), so a kernel's write to a buffer that is not in the cache costs a read
#     and a write of its bytes; one to a buffer just written or read costs the write alone. A
#     compiled graph reuses the buffers it freed for its temporaries, which are then hot, but
#     allocates its outputs afresh: the values a forward graph saves for backward, the
#     gradients a backward graph hands on. So a pointwise kernel's writes to its graph's
#     outputs move ``Efficiency.write_allocate`` of their bytes again, from memory.
#     ``benchmarks/cache_reuse.py`` times ``y = x * 2`` with ``x`` just written and ``y``
#     just written or in memory: the cold write adds 0.88-0.94 of ``y``'s bytes' time at the
#     cold bandwidth over 2-16 MiB (1.02-1.11 in a later run), so the CPU's figure is 0.9. It
#     is what a plan that saves less gains in forward beyond the bytes it does not write:
#     kernel by kernel (``kernel_prices.py --plans``), HF ViT's and Llama's plans at compile's
#     budgets ran their forward pointwise kernels 2-5 ms faster than the unchecked step's,
#     priced 0-1.5 ms faster without it. A GPU's L2 takes a fully written sector without
#     fetching it: 0 there.
#
#     With it (the same instrument, eight steps, on the plans ``compile.py`` measured), those
#     forward kernels are priced 5-8 ms faster than the unchecked step's where they ran
#     2.4-5.1 ms faster, so the price overshoots there, while the recomputed pointwise
#     kernels in backward stay priced over their time: ViT's +5.2..+10.1 ms where they ran
#     -0.1..+2.3, Llama's +6.5..+12.1 where +5.7..+10.7. The graphs' overheads read HF ViT
#     -1.0/-0.7/-0.6% against -1.2/-0.3/-0.3% measured, HF Llama +10.5/+3.4/+1.2% against
#     +11.6/+4.5/+1.1%; the pointwise kernels' time-weighted |log(price / time)| is 0.30
#     (ViT) and 0.40 (Llama), the whole unchecked step's pointwise kernels priced 1% under
#     their time on ViT and 13% over on Llama. Only writes to a graph's outputs are known to
#     land in fresh memory; a temporary inductor allocates rather than reuses may too.
#
#     How fresh an output's memory is, the graph cannot tell: malloc hands it a chunk freed
#     some while before, perhaps a temporary of the same graph. And the fetch is graded by how
#     stale the line is, not all or nothing: ``cache_reuse.py`` writes 16 MiB after streaming
#     16/64/128/256/512/1024 MiB elsewhere, and the write adds 0.06/0.32/0.63/1.08/1.13/1.17
#     of its bytes' time (one thread; this host's last-level cache is 480 MiB, shared). Offline,
#     on the kernels ``kernel_prices.py --plans`` timed, a share of 0.3 on outputs' writes
#     prices both models' forward differences as they ran (Llama -3.5/-2.4/-1.9 ms against
#     -2.4/-2.3/-2.7, ViT -2.2/-3.4/-3.6 against -2.3/-4.9/-4.7), but only that instrument
#     supports the figure, and with ViT's recompute in backward still priced over its time it
#     moves ViT's predictions to the wrong sign; so 0.9 stands until the staleness of the
#     memory an output is given is priced from the step itself.
#
#     A pointwise kernel's arithmetic is not priced: timed compiled on one thread beside a
#     copy of the same bytes (0.37 ns an element in the cache), erf adds 0.23 ns an element,
#     exp 0.10, sigmoid 0.12, tanh 1.1, and priced so, HF ViT's unchecked GELU-gradient
#     kernels read 18.2 ms against 19.7 measured (11.4 by their bytes), but the plans'
#     recomputed GELU kernels, fused beside the gradient, were priced 8.6 ms over their time
#     and the plans' backward difference moved further from it (+9.7..+16.4 ms against
#     -0.1..+2.7): the recompute's arithmetic overlaps what the kernel waits on.
