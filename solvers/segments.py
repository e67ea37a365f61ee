"""Every segment from one block in one pass: ``run_terms``' figures, each in O(1) from the last.

Example:
    >>> from ckptplan.solvers.chain import Chain, ChainBlock, run_terms
    >>> blocks = tuple(ChainBlock(f"b{i}", 1.0, 10, 30, True, 100 + 40 * i, 150 + 40 * i, 20,
    ...                           140 + 40 * i, 170 + 40 * i) for i in range(4))
    >>> chain = Chain(blocks)
    >>> [(end, peak) for end, peak, _, _ in segment_terms(chain, 0, None, 4)][:2]
    [(1, 170), (2, 210)]
    >>> run_terms(chain, 0, 2, True).local_peak()[0]
    210
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from ckptplan.solvers.chain import Chain, block_saving, replayed_peak


def segment_terms(
    chain: Chain, start: int, option: int | None, longest: int
) -> Iterator[tuple[int, float, int, float]]:
    """(end, local peak, saving, recompute time) of the segment ``[start, end)`` for every end
    a segment from ``start`` may reach in ``longest`` blocks, every block under ``option`` (an
    index into each block's options, None for plain recompute): ``run_terms``' figures, each
    in O(1) from the last, so a start's segments cost O(n) instead of O(n^2).

    The members before the last contribute events that do not depend on where the segment
    ends, save the recomputation's common base (the last block's backward start, the total
    saving, what the last block holds): their maxima are carried along, the last member and
    the base added per end.
    """
    blocks = chain.blocks
    first = blocks[start]
    extra_input = 0 if first.input_kept else first.input_bytes
    region = chain.region_bytes
    most_forward = most_recompute = most_backward = -math.inf
    saved_before = restored = outputs_held = 0
    time = 0.0
    for end in range(start + 1, min(len(blocks), start + longest) + 1):
        j = end - 1 - start
        b = blocks[end - 1]
        if j and not b.joins_previous:
            return
        if option is not None and option >= len(b.options):
            return
        o = b.options[option] if option is not None else None
        inner = o.kept_bytes if o else 0
        kept = inner - (b.output_bytes if o and o.keeps_output else 0)
        held = o.held_bytes if o else 0
        saving = block_saving(b, j == 0) - kept
        freed = 0 if o and o.keeps_output else b.freed_output_bytes
        total = saved_before + saving + freed
        held_input = extra_input if j else 0
        forward = b.fwd_start - saved_before + b.fwd_peak_nograd + kept + outputs_held + held_input
        dropped = 0 if o and o.keeps_output else b.own_output_bytes
        base = b.bwd_start - total - dropped + freed + held + region
        own = restored + (b.input_bytes if j else 0)
        replay = (b.fwd_peak if o else replayed_peak(b)) - b.fwd_start - kept
        events = [
            most_forward,
            forward,
            base + max(most_recompute, own + replay),
            max(most_backward, b.bwd_peak) + extra_input + held,
            *(v - total + freed for v, _ in b.after_peaks),
        ]
        time += o.recompute_time if o else b.fwd_time
        tail = o.tail_time if o else b.tail_time
        yield end, max(events) + region, total - region, time - tail
        # As an inner member: its kept bytes in full, its own peak replayed.
        inner_saving = block_saving(b, j == 0) - inner
        most_forward = max(most_forward, forward + inner - kept)
        most_recompute = max(most_recompute, own + b.fwd_peak - b.fwd_start - inner)
        most_backward = max(most_backward, b.bwd_peak)
        saved_before += inner_saving
        restored += b.saved_bytes - inner if j == 0 else inner_saving
        outputs_held += b.input_bytes if j else 0
