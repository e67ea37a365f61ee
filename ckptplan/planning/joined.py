"""Joined selective regions for a compiled step: one region over a run of blocks, each block
keeping the op outputs its own option tags.

Under compile, a region of one block must save its input, and keeping a block's output (the
next block's input) is its business alone. Inside one region over many blocks, the
partitioner rebuilds each block's input from what the blocks before it keep, so no block input
is saved unless tagged: compile's own budget saves its matmuls that way, and one-block regions
cannot reach its speed at its memory (Note [why compiled regions join]). The chain model cannot
price such a region: what backward holds while it rebuilds one depends on inductor's fusion,
which only the fake run sees. So a joined plan is searched on fake-run peaks, along the
frontier of one option per block (``solvers.selective.combinations``) of the menus priced
inside a region (``selective_menus(..., joined=True)``): a combination's peak is taken as its
kept bytes plus what the last fake run held beyond its own kept bytes, and each fake run
corrects that offset (Note [searching a joined frontier]).

Example: a frontier of four combinations whose fake runs hold 100 bytes beyond what they keep,
and 5 more from the third on; an aim of 131 bytes admits the second and not the third.

    >>> from ckptplan.solvers.selective import Combination
    >>> front = [Combination((i,), size, 4.0 - i) for i, size in enumerate((0, 20, 30, 40))]
    >>> peaks = lambda i: 100 + front[i].kept_bytes + (5 if i >= 2 else 0)
    >>> fastest_fitting(front, 131, peaks)
    1
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence

from ckptplan.solvers.chain import Chain
from ckptplan.solvers.selective import Combination, Selection

FAKE_RUNS = 5
"""Fake runs one joined search may take, the first included."""


def joined_runs(chain: Chain, menus: Sequence[Sequence[Selection]]) -> list[tuple[int, int]]:
    """The maximal runs ``[start, end)`` of two blocks or more that one region may cover: every
    block with options (a compiled block with random ops has none), each after the first
    allowed in a segment with the one before it."""
    runs: list[tuple[int, int]] = []
    start = None
    for i, block in enumerate(chain.blocks):
        if start is not None and not (menus[i] and block.joins_previous):
            if i - start > 1:
                runs.append((start, i))
            start = None
        if start is None and menus[i]:
            start = i
    if start is not None and len(chain.blocks) - start > 1:
        runs.append((start, len(chain.blocks)))
    return runs


def fastest_fitting(
    front: Sequence[Combination], aim: int, peak_of: Callable[[int], int]
) -> int | None:
    """The index of the fastest combination of ``front`` (bytes rising) whose peak, by
    ``peak_of``, is within ``aim``, searched in at most ``FAKE_RUNS`` calls; None where the
    leanest is over."""
    sizes = [c.kept_bytes for c in front]
    peak = peak_of(0)
    if peak > aim:
        return None
    fits, over = 0, len(front)
    offset = peak - sizes[0]
    for _ in range(FAKE_RUNS - 1):
        trial = min(bisect_right(sizes, aim - offset) - 1, over - 1)
        if trial <= fits:
            break
        peak = peak_of(trial)
        fits, over = (trial, over) if peak <= aim else (fits, trial)
        offset = peak - sizes[trial]
    return fits


# Note [searching a joined frontier]
#     What a compiled step holds at its peak beyond the tensors a joined region keeps is
#     nearly the same from one combination to the next (the step's parameters, the batch, the
#     backward of the block at the peak), so the first fake run's offset places the aim on the
#     frontier within a few combinations, and each later run measures the offset where the
#     search now is. A run over the aim makes every richer combination a non-candidate, and a
#     run within it every leaner one, so the search never tries one combination twice. Of
#     equal bytes, the frontier keeps more in later blocks (``combinations``): the last block's
#     backward runs at the step's peak, where keeping spares a rebuilt tensor.


# Note [why compiled regions join]
#     On the ViT sample at compile's own 0.5 point, compile keeps per block the qkv, attention
#     output, projection and both MLP matmuls, and no block input: each is rebuilt in backward
#     from the residual adds. One-block regions must save twelve block inputs as well, so at
#     that peak the chain solver's best plan of one-block regions ran x1.022 of compile's time.
#     Merging those regions as they were chosen ran slower (x1.064): options chosen to end a
#     segment keep the first MLP matmul and not the second, and inside one region each block's
#     output then costs the second matmul again. Options priced inside a region keep what
#     compile keeps, in other tensors of the same sizes: at that point the joined plans peaked
#     at 280,836,544 B and 283,523,680 B against compile's 286,706,368 B (their fake runs 4 B
#     under the allocator) and tied its time, x0.992 and x1.001 in two runs of
#     ``benchmarks/compile.py``.
