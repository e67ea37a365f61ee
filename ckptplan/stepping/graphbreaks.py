"""Graph breaks while ``torch.compile`` traces: the one place ckptplan reads dynamo's private
counters (the runtime never does)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ckptplan.stepping.compiled import Partition


@contextmanager
def counting_breaks(log: Partition) -> Iterator[None]:
    """Adds the graph breaks dynamo counts while the block runs to ``log.graph_breaks``. A
    frame skipped whole after a break (in a loop, where dynamo cannot resume) is counted as
    unimplemented, not as a break, so both counters are read."""
    from torch._dynamo.utils import counters

    def total() -> int:
        return sum(sum(counters[kind].values()) for kind in ("graph_break", "unimplemented"))

    before = total()
    try:
        yield
    finally:
        log.graph_breaks += total() - before
