"""How reports word their figures, one way in every report (torch-free): memory in one binary
unit per report, the batch a plan or profile was made for, and a measured time with its spread.

>>> unit = ByteUnit.of(3 * 2**30, 12 * 2**20, None)
>>> unit(3 * 2**30), unit(512 * 2**20), unit(64 * 2**10), unit(0)
('3.00 GiB', '0.50 GiB', '<0.01 GiB', '0.00 GiB')
>>> batch_words(None, {"x": [[4, 16], "torch.float32"]}), batch_words(8, None)
("batch 4 (the model's)", 'batch 8')
>>> with_spread(1.18, (1.15, 1.21), ratio), with_spread(0.2, (0.2, 0.2), percent)
('1.18x ± 0.03x', '+20.0% (1 run, no spread)')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


@dataclass(frozen=True)
class ByteUnit:
    """The unit of every memory figure in one report, read from its largest figure, so that
    a report never mixes units: figures have two decimals, and one too small to show in
    them reads ``<0.01`` (not ``0.000061 GiB``). Below a KiB, whole bytes."""

    name: str
    size: int

    @classmethod
    def of(cls, *figures: float | None) -> ByteUnit:
        """The unit of a report whose figures (None: absent) are these."""
        largest = max((abs(f) for f in figures if f is not None), default=0)
        return next((cls(n, s) for n, s in _UNITS if largest >= s), cls("B", 1))

    def __call__(self, n: float) -> str:
        if self.size == 1:
            return f"{round(n)} B"
        value = n / self.size
        if 0 < abs(value) < 0.005:
            return f"<0.01 {self.name}"
        return f"{value:.2f} {self.name}"


def batch_words(batch_size: int | None, inputs: Any) -> str:
    """The batch a plan or profile was made for: ``batch 8`` as given (``--batch-size``),
    ``batch 4 (the model's)`` from the model's own inputs (their recorded ``[shape, dtype]``
    leaves, one leading size), else ``the model's batch``."""
    if batch_size:
        return f"batch {batch_size}"
    sizes = {shape[0] for shape, _ in input_shapes(inputs) if shape}
    return f"batch {sizes.pop()} (the model's)" if len(sizes) == 1 else "the model's batch"


def input_shapes(inputs: Any) -> list[tuple[list[int], str]]:
    """The ``[shape, dtype]`` leaves of a plan's or profile's recorded inputs."""
    if (
        isinstance(inputs, list | tuple)
        and len(inputs) == 2
        and isinstance(inputs[0], list | tuple)
        and all(isinstance(d, int) for d in inputs[0])
        and str(inputs[1]).startswith("torch.")
    ):
        return [(list(inputs[0]), inputs[1])]
    if isinstance(inputs, dict):
        inputs = list(inputs.values())
    if isinstance(inputs, list | tuple):
        return [leaf for item in inputs for leaf in input_shapes(item)]
    return []


def ratio(x: float) -> str:
    """A step-time ratio: ``1.18x``."""
    return f"{x:.2f}x"


def percent(x: float) -> str:
    """A signed fraction: ``+18.0%``, ``-3.5%``."""
    return f"{100 * x:+.1f}%"


def with_spread(median: float, bounds: tuple[float, float], words: Callable[[float], str]) -> str:
    """A measured figure, the median of its repeats, with half the range of the repeats:
    ``1.18x ± 0.03``; where the repeats agree exactly (one run), says there is no spread."""
    low, high = bounds
    if low == high:
        return f"{words(median)} (1 run, no spread)"
    half = words((high - low) / 2).lstrip("+")
    return f"{words(median)} ± {half}"


SPREAD_NOTE = "measured times: median ± half the range over the timed runs"
"""What ``with_spread`` shows, for a report's footnote."""
