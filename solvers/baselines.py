"""Fixed checkpointing policies that ckptplan's optimal plans are compared against."""

from __future__ import annotations

import math

from ckptplan.solvers.chain import Chain, Schedule, Segment, simulate


def _split_at_breaks(chain: Chain, segments: list[Segment]) -> list[Segment]:
    """Cut segments where a block cannot join the one before it (a skip or a changed input)."""
    out: list[Segment] = []
    for start, end in segments:
        cut = start
        for k in range(start + 1, end):
            if not chain.blocks[k].joins_previous:
                out.append((cut, k))
                cut = k
        out.append((cut, end))
    return out


def none(chain: Chain) -> Schedule:
    """No checkpointing: every activation kept."""
    return simulate(chain, [], "none")


def full(chain: Chain) -> Schedule:
    """Every block checkpointed on its own, as ``gradient_checkpointing=True`` does."""
    return simulate(chain, [(k, k + 1) for k in range(len(chain.blocks))], "full")


def every_k(chain: Chain, k: int = 2) -> Schedule:
    """Every k-th block checkpointed on its own (the Hugging Face / Megatron "every n" policy)."""
    if k < 1:
        raise ValueError(f"every-k needs k >= 1, got {k}")
    segments = [(i, i + 1) for i in range(k - 1, len(chain.blocks), k)]
    return simulate(chain, segments, f"every-{k}")


def sqrt(chain: Chain) -> Schedule:
    """Chen et al. 2016: about sqrt(N) evenly sized segments of consecutive blocks."""
    n = len(chain.blocks)
    if n == 0:
        return simulate(chain, [], "sqrt")
    size = max(1, round(math.sqrt(n)))
    segments = [(s, min(s + size, n)) for s in range(0, n, size)]
    return simulate(chain, _split_at_breaks(chain, segments), "sqrt")
