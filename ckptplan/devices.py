"""Roofline figures of the devices ckptplan can estimate time for, without running there.

An op's time is ``max(FLOPs / peak FLOP/s for its dtype, bytes moved / memory bandwidth)``.
Figures are dense (no sparsity) vendor peaks; ``cpu`` is a two-core laptop-class machine.
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

    def op_time(self, flops: float, bytes_moved: float, half: bool) -> float:
        peak = self.half_flops if half else self.fp32_flops
        return max(flops / peak, bytes_moved / self.bandwidth)


DEVICES = {
    d.name: d
    for d in (
        Device("h100", 67e12, 989e12, 3.35e12),
        Device("a100", 19.5e12, 312e12, 2.0e12),
        Device("l4", 30e12, 121e12, 0.3e12),
        Device("rtx4090", 82.6e12, 165e12, 1.0e12),
        Device("cpu", 1.0e11, 0.5e11, 2.0e10),
    )
}


def get_device(name: str) -> Device:
    try:
        return DEVICES[name.lower()]
    except KeyError:
        raise CkptplanError(
            f"unknown device {name!r}; choose one of {', '.join(DEVICES)}"
        ) from None
