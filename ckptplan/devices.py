"""Roofline figures of the devices ckptplan can estimate time for, without running there.

An op's time is ``max(FLOPs / peak FLOP/s for its dtype, bytes moved / memory bandwidth)``.
Figures are dense (no sparsity) vendor peaks; ``cpu`` is a two-core laptop-class machine (its
policy cost measured with ``--measure`` on the GPT sample's blocks: 34-58 µs per op call).
``host_bandwidth`` is what one direction of the host link (PCIe) sustains, the price of
offloading a saved tensor to host memory and back; a CPU has no host to offload to.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptplan.errors import CkptplanError


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
    policy_op_time: float = 0.0
    """Seconds a selective-checkpoint policy adds per op call: host time in its Python
    dispatch modes. On a GPU the host runs ahead of kernels long enough to need checkpointing,
    so it hides there (0); on a CPU it is paid in line. ``--measure`` measures it."""

    margin_percent: float = 3.0
    """Share of the budget a plan leaves unused by default (``--margin``). On a GPU the
    caching allocator rounds blocks and fragments, which the prediction does not model yet.
    On the CPU the fake run executes the plan's own checkpoint code and matches the
    allocator's own figure but for scalars made outside dispatch (an optimizer's wrapped
    numbers, 8 bytes each): 0.1% covers them."""

    allocation_block: int = 512
    """Bytes every allocation is rounded up to, as the budgeted figure counts them: CUDA's
    caching allocator hands out 512-byte multiples (``max_memory_allocated`` counts them so);
    the CPU allocator's live bytes are the tensors' own."""

    def op_time(self, flops: float, bytes_moved: float, half: bool) -> float:
        peak = self.half_flops if half else self.fp32_flops
        return max(flops / peak, bytes_moved / self.bandwidth)

    def offload_time(self, nbytes: int) -> float | None:
        """Time to copy ``nbytes`` to host memory and back; None where there is no host."""
        return 2 * nbytes / self.host_bandwidth if self.host_bandwidth else None


DEVICES = {
    d.name: d
    for d in (
        Device("h100", 67e12, 989e12, 3.35e12, host_bandwidth=50e9),
        Device("a100", 19.5e12, 312e12, 2.0e12, host_bandwidth=25e9),
        Device("l4", 30e12, 121e12, 0.3e12, host_bandwidth=25e9),
        Device("rtx4090", 82.6e12, 165e12, 1.0e12, host_bandwidth=25e9),
        Device(
            "cpu",
            1.0e11,
            0.5e11,
            2.0e10,
            policy_op_time=45e-6,
            margin_percent=0.1,
            allocation_block=1,
        ),
    )
}


def get_device(name: str) -> Device:
    try:
        return DEVICES[name.lower()]
    except KeyError:
        raise CkptplanError(
            f"unknown device {name!r}; choose one of {', '.join(DEVICES)}"
        ) from None
