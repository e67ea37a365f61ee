"""The chain model of a training step, shared by every chain solver and by the simulator.

A chain is the sequence of blocks (transformer layers, residual blocks) of one training step,
described by what an *unchecked* step does: the live bytes at the start and peak of each block's
forward and backward. A plan checkpoints runs of consecutive blocks (segments). Checkpointing
block k lowers every later live-bytes figure by its *saving* (the bytes autograd no longer keeps
for it), until its segment is recomputed at the start of the segment's backward.

With ``P`` the savings of all checkpointed blocks before a run, every event inside the run has
live bytes ``value - P``: that form lets the dynamic programme compose runs right to left. The
execution it describes is non-reentrant ``torch.utils.checkpoint`` (docs/design.md §5).

Example:
    >>> blocks = [ChainBlock(f"b{i}", fwd_time=1.0, input_bytes=10, saved_bytes=30,
    ...           input_kept=True, fwd_start=100 + 40 * i, fwd_peak=150 + 40 * i,
    ...           fwd_peak_nograd=20, bwd_start=140 + 40 * i, bwd_peak=170 + 40 * i)
    ...           for i in range(4)]
    >>> chain = Chain(tuple(blocks), tail_peaks=((280, "loss"),), fixed_peaks=((120, "embed"),))
    >>> simulate(chain, []).peak, simulate(chain, [(0, 2), (2, 4)]).peak
    (290, 220)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Segment = tuple[int, int]
"""A checkpointed run of blocks ``[start, end)`` (0-based, end exclusive)."""


@dataclass(frozen=True)
class BlockOption:
    """A selective policy for a checkpointed block: keep some op outputs, recompute the rest."""

    kept_bytes: int
    """Bytes of the op outputs kept through forward (beyond the block's input)."""
    recompute_time: float
    """Time of the ops that still run again in backward."""
    keeps_output: bool = False
    """It keeps the block's output (counted in ``kept_bytes``), which costs nothing through
    forward when the block ends its segment (the output lives on as the next block's input)."""
    held_bytes: int = 0
    """Kept outputs of the ops after the block's last saving op: when the block ends its
    segment, recomputation stops before them, so their cached copies stay through backward."""
    tail_time: float = 0.0
    """Time of the ops after the last saving op that the option would recompute: skipped
    when the block ends its segment."""


@dataclass(frozen=True)
class ChainBlock:
    """One block of the chain, measured on the unchecked training step (bytes, seconds)."""

    name: str
    fwd_time: float
    input_bytes: int
    saved_bytes: int
    """Bytes autograd keeps for this block's backward, its input and output excluded."""
    input_kept: bool
    """Whether the unchecked step keeps the block's input alive until its backward."""
    fwd_start: int
    fwd_peak: int
    fwd_peak_nograd: int
    """Transient of the forward under ``no_grad`` (as checkpointed blocks run), above the start."""
    bwd_start: int
    """Live bytes when the gradient of the block's output is ready."""
    bwd_peak: int
    joins_previous: bool = True
    """Whether the block may share a segment with the block before it."""
    output_bytes: int = 0
    own_output_bytes: int = 0
    """Output bytes that only the block's own backward keeps (a final ReLU saves its result):
    counted in ``bwd_start``, but a checkpointed block has dropped them when its backward
    starts (its recomputation makes them again)."""
    freed_output_bytes: int = 0
    """The part of ``own_output_bytes`` no later code keeps (Note [a segment's freed output])."""
    tail_time: float = 0.0
    """Time of the forward ops after the last op that saves a tensor for backward: a
    recomputation that ends with this block stops before them."""
    options: tuple[BlockOption, ...] = ()
    """Selective policies the block may take instead of recomputing everything."""
    replay_peak: int | None = None
    """Live bytes at the forward's peak up to its last op that saves a tensor: a recomputation
    that ends with this block stops there (None: ``fwd_peak``)."""
    after_peaks: tuple[tuple[int, str], ...] = ()
    """(live bytes, label) of the code between this block and the next (a stage's downsampling,
    a second tower's embedding), in forward and in backward: checkpointing this block and the
    blocks before it lowers them by their savings."""


# Note [a segment's freed output]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# An output that only its block's backward keeps (a final ReLU saves it) and that no later code
# saves (an average pool saves only its shape) is freed once read when the block is
# checkpointed: a segment that ends with it saves it too (SimCLR: 0.5 MiB of 10). The code right
# after the segment still runs with it alive. Inside a segment it is the next member's input.


def replayed_peak(block: ChainBlock) -> int:
    """Live bytes at the forward's peak up to its last op that saves a tensor."""
    return block.fwd_peak if block.replay_peak is None else block.replay_peak


@dataclass(frozen=True)
class AfterCode:
    """An enclosing module's own code after its last block (a stage's patch merging), measured
    on the unchecked step: live bytes at its forward's start and peak and its backward's start
    and peak, what it saves for backward, and its forward time."""

    fwd_start: int
    fwd_peak: int
    bwd_start: int
    bwd_peak: int
    saved_bytes: int
    fwd_time: float


@dataclass(frozen=True)
class Enclosure:
    """A module around blocks ``[start, end)`` (a stage), which a plan may checkpoint whole
    with each of its blocks checkpointed again inside it (nested). Its forward then keeps only
    its input; its recomputation, at the start of its backward, the blocks' inputs; each block
    is recomputed once more in its own backward. ``after`` is its code after the last block."""

    name: str
    start: int
    end: int
    after: AfterCode | None = None


@dataclass(frozen=True)
class Chain:
    """A training step as a chain of blocks, plus the events outside the blocks."""

    blocks: tuple[ChainBlock, ...]
    tail_peaks: tuple[tuple[int, str], ...] = ()
    """(live bytes, label) of events after the last block's forward and before its backward."""
    fixed_peaks: tuple[tuple[int, str], ...] = ()
    """(live bytes, label) of events no plan changes (embedding, optimizer step)."""
    enclosures: tuple[Enclosure, ...] = ()
    region_bytes: int = 0
    """Bytes each checkpoint keeps outside the ops, from its forward until its backward, in
    the budgeted memory (the CPU RNG state ``preserve_rng_state`` stashes, on a CPU); its
    recomputation holds one more (the state it restores afterwards) while it replays."""


@dataclass(frozen=True)
class Schedule:
    """A solver's answer: the checkpointed segments and their predicted cost."""

    solver: str
    segments: tuple[Segment, ...]
    peak: int
    recompute_time: float
    peak_event: str
    optimal: bool = False
    options: tuple[tuple[int, int], ...] = ()
    """(block, option index) for each checkpointed block that runs a selective policy."""
    nested: tuple[int, ...] = ()
    """Indices of the chain's enclosures checkpointed whole, nested (their blocks are in no
    segment)."""


class InfeasibleBudget(ValueError):
    """No plan of this solver fits the budget; ``least_peak`` is the smallest peak it can reach."""

    def __init__(self, budget: int, least_peak: int) -> None:
        super().__init__(f"budget {budget} B is below the least feasible peak {least_peak} B")
        self.budget = budget
        self.least_peak = least_peak


@dataclass(frozen=True)
class RunTerms:
    """Events of one run of blocks as ``value - P``, with the run's saving and recompute time."""

    events: tuple[tuple[float, str], ...]
    saving: int
    recompute_time: float

    def local_peak(self) -> tuple[float, str]:
        return max(self.events)


def block_saving(block: ChainBlock, starts_segment: bool) -> int:
    """Bytes no longer kept through forward when ``block`` is checkpointed."""
    kept_input_plain = block.input_bytes if block.input_kept else 0
    kept_input_ckpt = block.input_bytes if starts_segment else 0
    return block.saved_bytes + kept_input_plain - kept_input_ckpt


def run_terms(
    chain: Chain,
    start: int,
    end: int,
    checkpointed: bool,
    options: Sequence[BlockOption | None] = (),
) -> RunTerms:
    """The events of blocks ``[start, end)``: unchecked (one block), or one segment whose
    blocks may run selective ``options`` (one per block, None for plain recompute).
    """
    blocks = chain.blocks[start:end]
    if not checkpointed:
        assert end == start + 1 and not any(options), "an unchecked run is one plain block"
        b = blocks[0]
        return RunTerms(
            events=(
                (b.fwd_peak, f"forward of {b.name}"),
                (b.bwd_peak, f"backward of {b.name}"),
                *b.after_peaks,
            ),
            saving=0,
            recompute_time=0.0,
        )
    chosen = list(options) or [None] * len(blocks)
    assert len(chosen) == len(blocks), "one option (or None) per block of the segment"
    last = blocks[-1]
    kept = [o.kept_bytes if o else 0 for o in chosen]
    # A kept output of the segment costs nothing until the segment's backward, where its cached
    # copy stays alive (recomputation stops before the op that would take it back).
    final = chosen[-1]
    if final and final.keeps_output:
        kept[-1] -= last.output_bytes
    held = final.held_bytes if final else 0
    savings = [block_saving(b, i == 0) - kept[i] for i, b in enumerate(blocks)]
    freed = 0 if final and final.keeps_output else last.freed_output_bytes
    total = sum(savings) + freed
    first = blocks[0]
    extra_input = 0 if first.input_kept else first.input_bytes
    events: list[tuple[float, str]] = []
    saved_before = 0
    restored = 0
    # The region returns every member's output at once, so the forward of member i also holds
    # the outputs of members 0..i-2 until the model's code takes them.
    outputs_held = 0
    # The segment's output, when only its own backward kept it, is gone until recomputed; a
    # cached copy (an option that keeps it) stays.
    dropped = 0 if final and final.keeps_output else last.own_output_bytes
    for i, b in enumerate(blocks):
        # A later member runs while the checkpoint holds the region's input, kept or not.
        held_input = extra_input if i else 0
        forward = b.fwd_start - saved_before + b.fwd_peak_nograd + kept[i]
        events.append((forward + outputs_held + held_input, f"forward of {b.name}"))
        # A later member's input is the output its predecessor just recomputed.
        recompute_live = (
            last.bwd_start - total - dropped + freed + restored + (b.input_bytes if i else 0)
        )
        peak = b.fwd_peak if b is not last or final else replayed_peak(b)
        transient = peak - b.fwd_start - kept[i]
        replay = chain.region_bytes  # the state the recomputation saves while it replays
        events.append((recompute_live + transient + held + replay, f"recompute of {b.name}"))
        events.append((b.bwd_peak + extra_input + held, f"backward of {b.name}"))
        saved_before += savings[i]
        restored += b.saved_bytes - kept[i] if i == 0 else savings[i]
        outputs_held += b.input_bytes if i else 0
    recompute = sum(
        o.recompute_time if o else b.fwd_time for o, b in zip(chosen, blocks, strict=True)
    )
    recompute -= final.tail_time if final else last.tail_time
    events.extend((v - total + freed, e) for v, e in last.after_peaks)
    return _with_states(RunTerms(tuple(events), total, recompute), 1, chain.region_bytes)


def _with_states(terms: RunTerms, checkpoints: int, region_bytes: int) -> RunTerms:
    """``terms`` with the state each of its ``checkpoints`` keeps from its forward on."""
    extra = checkpoints * region_bytes
    return RunTerms(
        tuple((v + extra, e) for v, e in terms.events),
        terms.saving - checkpoints * region_bytes,
        terms.recompute_time,
    )


def nested_terms(chain: Chain, index: int) -> RunTerms:
    """The events of enclosure ``index`` checkpointed whole with each block inside it
    checkpointed again (see ``Enclosure``), as ``value - P``."""
    enclosure = chain.enclosures[index]
    blocks = chain.blocks[enclosure.start : enclosure.end]
    after = enclosure.after
    first, last = blocks[0], blocks[-1]
    extra_input = 0 if first.input_kept else first.input_bytes
    # Forward, as one segment of the blocks, the enclosure's own code dropping what it saves.
    flat = [block_saving(b, i == 0) for i, b in enumerate(blocks)]
    total = sum(flat) + (after.saved_bytes if after else 0)
    events: list[tuple[float, str]] = []
    for i, b in enumerate(blocks):
        live = b.fwd_start - sum(flat[:i]) + b.fwd_peak_nograd + (extra_input if i else 0)
        events.append((live, f"forward of {b.name}"))
    # The enclosure's recomputation starts with its backward and keeps each block's input
    # (the inner checkpoints save them). Early stop: without code after the blocks, the last
    # thing it saves is the last block's input, so the last block is not run.
    start = (after.bwd_start if after else last.bwd_start - last.own_output_bytes) - total
    recomputed = blocks if after else blocks[:-1]
    inputs = 0
    for i, b in enumerate(recomputed):
        inputs += b.input_bytes if i else 0
        live = start + inputs + b.fwd_peak_nograd + chain.region_bytes
        events.append((live, f"recompute of {enclosure.name}"))
    recompute = sum(b.fwd_time for b in recomputed)
    # Then each block backward as if checkpointed on its own: the enclosure holds the inputs
    # of the blocks before, as separate checkpoints would.
    singles = [block_saving(b, True) for b in blocks]
    for i, b in enumerate(blocks):
        before = sum(singles[:i])
        own = b.bwd_start - singles[i] - b.own_output_bytes + replayed_peak(b) - b.fwd_start
        events.append((own - before + chain.region_bytes, f"recompute of {b.name}"))
        held = 0 if b.input_kept else b.input_bytes
        events.append((b.bwd_peak + held - before, f"backward of {b.name}"))
        recompute += b.fwd_time - b.tail_time
    if after:
        transient = after.fwd_peak - after.fwd_start + last.output_bytes
        live = start + inputs + transient + chain.region_bytes
        events.append((live, f"recompute of {enclosure.name}"))
        events.append((after.fwd_peak - sum(flat), f"forward of {enclosure.name}"))
        events.append((after.bwd_peak - sum(singles), f"backward of {enclosure.name}"))
        recompute += after.fwd_time
    else:
        events.extend((v - total, e) for v, e in last.after_peaks)
    terms = RunTerms(tuple(events), total, recompute)
    return _with_states(terms, 1 + len(blocks), chain.region_bytes)


def validate_segments(chain: Chain, segments: Sequence[Segment]) -> list[Segment]:
    """Sorted, non-overlapping, in range, and joining only blocks that may share a segment."""
    ordered = sorted(segments)
    previous_end = 0
    for start, end in ordered:
        if not 0 <= start < end <= len(chain.blocks) or start < previous_end:
            raise ValueError(f"segment {(start, end)} overlaps another or is out of range")
        for k in range(start + 1, end):
            if not chain.blocks[k].joins_previous:
                raise ValueError(f"block {chain.blocks[k].name} cannot join the segment before it")
        previous_end = end
    return ordered


def runs(
    chain: Chain, segments: Sequence[Segment], nested: Sequence[int] = ()
) -> list[tuple[int, int, bool, int | None]]:
    """Split the chain into checkpointed segments, nested enclosures (by index) and single
    unchecked blocks, in order: (start, end, checkpointed, enclosure or None)."""
    pieces: list[tuple[int, int, int | None]] = [
        (s, e, None) for s, e in validate_segments(chain, segments)
    ]
    pieces += [(chain.enclosures[k].start, chain.enclosures[k].end, k) for k in nested]
    out: list[tuple[int, int, bool, int | None]] = []
    position = 0
    for start, end, enclosure in sorted(pieces):
        if start < position:
            raise ValueError(f"blocks {start}..{end - 1} are in two checkpointed runs")
        out.extend((k, k + 1, False, None) for k in range(position, start))
        out.append((start, end, True, enclosure))
        position = end
    out.extend((k, k + 1, False, None) for k in range(position, len(chain.blocks)))
    return out


def simulate(
    chain: Chain,
    segments: Sequence[Segment],
    solver: str = "given",
    options: Sequence[tuple[int, int]] = (),
    nested: Sequence[int] = (),
) -> Schedule:
    """Predicted peak and recompute time of a training step that checkpoints ``segments``,
    the blocks named in ``options`` (all inside segments) under their selective policies, and
    the enclosures ``nested`` whole with each of their blocks again inside.
    """
    chosen = dict(options)
    saved = 0
    recompute = 0.0
    peak: tuple[float, str] = max(
        ((float(v), e) for v, e in chain.fixed_peaks), default=(0.0, "start")
    )
    for start, end, checkpointed, enclosure in runs(chain, segments, nested):
        picks = [
            chain.blocks[k].options[chosen[k]] if k in chosen else None for k in range(start, end)
        ]
        if (not checkpointed or enclosure is not None) and any(picks):
            raise ValueError(f"block {chain.blocks[start].name} has an option but no segment")
        if enclosure is not None:
            terms = nested_terms(chain, enclosure)
        else:
            terms = run_terms(chain, start, end, checkpointed, picks if checkpointed else ())
        value, event = terms.local_peak()
        peak = max(peak, (value - saved, event))
        saved += terms.saving
        recompute += terms.recompute_time
    for value, event in chain.tail_peaks:
        peak = max(peak, (value - saved, event))
    return Schedule(
        solver,
        tuple(sorted(segments)),
        int(peak[0]),
        recompute,
        peak[1],
        options=tuple(sorted(chosen.items())),
        nested=tuple(sorted(nested)),
    )
