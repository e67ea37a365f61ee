"""From a Profile to the torch-free chain problem the solvers take.

``scope="step"`` budgets the whole step (parameters, gradients, optimizer state, batch,
activations); ``scope="activations"`` budgets activations alone, so the persistent bytes and
the gradients present at each event are taken out of every figure.

Each block may also carry a menu of selective policies (which op outputs to keep, and with a
host link which to offload, when it is checkpointed), the Pareto frontier of a knapsack over
its forward ops. Repeated blocks (alike in all the menu is made of) are solved once: O(d * k *
P) for d distinct blocks of k ops and frontiers of P points (``selective.frontier``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from ckptplan.devices import get_device
from ckptplan.errors import CkptplanError
from ckptplan.options import SCOPES
from ckptplan.planning.compiled_menus import compiled_menu, dataflow
from ckptplan.solvers.chain import AfterCode, BlockOption, Chain, ChainBlock, Enclosure
from ckptplan.solvers.selective import SaveItem, Selection, frontier
from ckptplan.values.profile_types import (
    BlockProfile,
    OpRecord,
    Profile,
    block_forward_records,
    replayed_count,
)

MENU_POINTS = 16
"""Selective options per block: enough to span the frontier (on the small GPT of
``benchmarks/ilp_gap.py`` within 0.0-0.8% of the whole frontier's cost; 8 lost up to 1.3%),
few enough for the chain DP (Llama-2-7B solves in 22 s on one core, 15 s with 8)."""

MENU_TOLERANCE = 0.02
"""Recompute time a block's frontier may lose while built, as a share of recomputing it all:
exact up to ``EXACT_POINTS`` points (Note [thinning the knapsack as it is built] in
``ckptplan.solvers.selective``); a Swin stage taken whole (299 ops) then takes seconds, not
the quarter of an hour of its exact frontier. The menu's ``MENU_POINTS`` are drawn from it."""


def to_chain(
    profile: Profile, scope: str = "step", menus: list[list[Selection]] | None = None
) -> Chain:
    """The chain of ``profile``; with ``menus`` (from ``selective_menus``) blocks get options."""
    if scope not in SCOPES:
        raise CkptplanError(f"unknown scope {scope!r}; choose one of {', '.join(SCOPES)}")
    blocks = []
    forward = block_forward_ops(profile)
    for i, b in enumerate(profile.blocks):
        block = replace(_chain_block(b), after_peaks=_gap_events(profile, i, scope))
        if scope == "activations":
            # A gradient leaves the activations the moment it is accumulated: the profile
            # kept each backward's peak of activations alone, and the gradients at its start.
            base = profile.persistent_bytes
            block = replace(
                block,
                fwd_start=b.fwd_start - base,
                fwd_peak=b.fwd_peak - base,
                replay_peak=None if b.replay_peak is None else b.replay_peak - base,
                bwd_start=b.bwd_start - base - b.grads_at_bwd_start,
                bwd_peak=b.bwd_peak - base - b.grads_at_bwd_peak,
            )
        unreplayed = _unreplayed(forward[i])
        block = replace(block, tail_time=sum(op.time for op in unreplayed.values()))
        if menus is not None:
            output = _output_op(b, forward[i])
            block = replace(
                block,
                options=tuple(
                    BlockOption(
                        s.kept_bytes,
                        s.recompute_time,
                        keeps_output=output in s.saved,
                        held_bytes=sum(
                            unreplayed[n].output_bytes for n in s.saved if n in unreplayed
                        ),
                        tail_time=len(unreplayed) * profile.policy_op_time
                        + sum(
                            op.time
                            for n, op in unreplayed.items()
                            if n not in s.saved and n not in s.offloaded
                        ),
                    )
                    for s in menus[i]
                ),
            )
        blocks.append(block)
    enclosures = _enclosures(profile, scope)
    states = profile.region_state_bytes
    if scope == "step":
        return Chain(tuple(blocks), profile.tail_peaks, profile.fixed_peaks, enclosures, states)
    base = profile.persistent_bytes
    grads = dict(profile.event_grads)
    return Chain(
        blocks=tuple(blocks),
        tail_peaks=tuple((v - base - grads.get(e, 0), e) for v, e in profile.tail_peaks),
        fixed_peaks=tuple((max(0, v - base - grads.get(e, 0)), e) for v, e in profile.fixed_peaks),
        enclosures=enclosures,
        region_bytes=states,
    )


def _enclosures(profile: Profile, scope: str) -> tuple[Enclosure, ...]:
    """The modules that may be checkpointed whole, nested; one whose code after its blocks
    has no backward of its own in the profile cannot be priced and is left out."""
    activations = scope == "activations"
    base = profile.persistent_bytes if activations else 0
    out = []
    for module in profile.enclosures:
        after = None
        if module.encloses_gap:
            gap = profile.blocks[module.end - 1].gap
            if gap is None or gap.bwd_peak is None or gap.bwd_start is None:
                continue
            after = AfterCode(
                fwd_start=gap.fwd_start - base,
                fwd_peak=gap.fwd_peak - base,
                bwd_start=gap.bwd_start - base - (gap.bwd_start_grads if activations else 0),
                bwd_peak=gap.bwd_peak - base - (gap.bwd_grads if activations else 0),
                saved_bytes=gap.saved_bytes,
                fwd_time=gap.fwd_time,
            )
        out.append(Enclosure(module.path, module.start, module.end, after))
    return tuple(out)


def _gap_events(profile: Profile, index: int, scope: str) -> tuple[tuple[int, str], ...]:
    """The peaks of the code between block ``index`` and the next, as chain events."""
    gap = profile.blocks[index].gap
    if gap is None:
        return ()
    between = f"between {profile.blocks[index].path} and {profile.blocks[index + 1].path}"
    base = profile.persistent_bytes if scope == "activations" else 0
    grads = gap.bwd_grads if scope == "activations" else 0
    events = [(gap.fwd_peak - base, f"forward {between}")]
    if gap.bwd_peak is not None:
        events.append((gap.bwd_peak - base - grads, f"backward {between}"))
    return tuple(events)


def _chain_block(b: BlockProfile) -> ChainBlock:
    return ChainBlock(
        name=b.path,
        fwd_time=b.time_fwd,
        input_bytes=b.input_bytes,
        saved_bytes=b.saved_bytes,
        input_kept=b.input_kept,
        fwd_start=b.fwd_start,
        fwd_peak=b.fwd_peak,
        fwd_peak_nograd=b.fwd_peak_nograd,
        bwd_start=b.bwd_start,
        bwd_peak=b.bwd_peak,
        joins_previous=b.joins_previous,
        output_bytes=b.output_bytes,
        own_output_bytes=b.own_output_bytes,
        freed_output_bytes=b.freed_output_bytes,
        replay_peak=b.replay_peak,
    )


def op_names(ops: Sequence[OpRecord]) -> list[str]:
    """``aten.op.overload#k`` for each op, ``k`` counting that overload's earlier calls in
    ``ops``: how a selective policy names the calls of a region."""
    calls: Counter[str] = Counter()
    names = []
    for op in ops:
        names.append(f"{op.op}#{calls[op.op]}")
        calls[op.op] += 1
    return names


def save_items(
    ops: list[OpRecord],
    free: set[int] | None = None,
    offload_time: Callable[[int], float | None] | None = None,
) -> list[SaveItem]:
    """The keep-or-recompute decisions of one block's forward, ops named ``op#k``.

    ``k`` counts the calls of that overload in the block's forward, as a selective policy sees
    them. In-place ops are never kept (their output is another op's storage), nor ops whose
    output an in-place op later overwrites; the random ops form one decision, so their outputs
    are kept or regenerated together (regenerated when one of them is in place, as dropout's
    ``bernoulli_`` on CPU: the RNG must replay every draw or none). Ops at the indices in
    ``free`` cost no memory to keep.
    ``offload_time`` prices a round trip of that many bytes to host memory (None: no host).
    """
    items: list[SaveItem] = []
    random: list[tuple[str, int, float]] = []
    for index, (name, op) in enumerate(zip(op_names(ops), ops, strict=True)):
        if not _keepable(op):
            continue
        size = 0 if free and index in free else op.output_bytes
        if op.random:
            random.append((name, size, op.time))
        else:
            items.append(SaveItem((name,), size, op.time))
    if random and all(_keepable(op) for op in ops if op.random):
        items.append(
            SaveItem(
                tuple(n for n, _, _ in random),
                sum(b for _, b, _ in random),
                sum(t for _, _, t in random),
            )
        )
    if offload_time is None:
        return items
    return [
        replace(item, offload_time=offload_time(item.output_bytes)) if item.output_bytes else item
        for item in items
    ]


def _keepable(op: OpRecord) -> bool:
    """A policy can cache this op's output: it owns fresh storage that nothing overwrites."""
    return not (op.inplace or op.mutated_later or op.output_bytes == 0)


def _unkept_time(ops: list[OpRecord], skip: Mapping[str, OpRecord]) -> float:
    """Time of the ops outside ``skip`` that run again under every option: those no policy
    can keep, and every random op when their group cannot be kept."""
    random_kept = all(_keepable(op) for op in ops if op.random)
    return sum(
        op.time
        for n, op in zip(op_names(ops), ops, strict=True)
        if n not in skip and (not _keepable(op) or (op.random and not random_kept))
    )


def _unreplayed(ops: list[OpRecord]) -> dict[str, OpRecord]:
    """The ops (``op#k``) after the block's last op that saves a tensor for backward.

    Recomputation stops once every saved tensor is back, so when the block ends its segment
    these never run again, and a cached output of theirs is never taken back."""
    replayed = replayed_count(ops)
    return dict(zip(op_names(ops)[replayed:], ops[replayed:], strict=True))


def _output_op(block: BlockProfile, ops: list[OpRecord]) -> str | None:
    """The ``op#k`` name of the op that makes the block's output, if it is the last op."""
    if not ops or ops[-1].output_bytes != block.output_bytes:
        return None
    return op_names(ops)[-1]


def _menu(
    block: BlockProfile,
    ops: list[OpRecord],
    points: int,
    offload_time: Callable[[int], float | None] | None,
    policy_op_time: float,
    compiled: bool = False,
    index_of: dict[int, int] | None = None,
    joined: bool = False,
) -> list[Selection]:
    """One block's options, each thinned to ``points``, sizes always counting every op kept.
    A compiled block with random ops has none (Note [selective options under torch.compile]);
    the others are priced as the partitioner runs them (``compiled_menu``).

    Two frontiers: for a block that ends its segment, recomputation never reaches the ops past
    its last save (nothing to keep there) and keeping its output is free (it lives on as the
    next block's input); for a block inside a segment, every op may be kept at its size.
    Recompute times always include every op not kept, as the chain takes the skipped tail off
    where the block ends its segment; ops no policy can keep (in-place ops such as dropout's
    ``bernoulli_``, views, outputs overwritten later) run again under every option. Every
    option also pays ``policy_op_time`` per op call its policy sees: each op in forward and
    again in recompute (the chain takes the skipped tail's calls off with its time).
    """
    if compiled and any(op.random for op in ops):
        return []
    name = _output_op(block, ops)
    if compiled:
        return compiled_menu(
            ops,
            op_names(ops),
            index_of or {},
            keepable=[_keepable(op) for op in ops],
            output=name,
            tail=_unreplayed(ops),
            seeds=[s.saved for s in frontier(save_items(ops), 4 * points, MENU_TOLERANCE)],
            points=points,
            joined=joined,
        )
    unreplayed = _unreplayed(ops)
    skipped = sum(op.time for op in unreplayed.values())
    policy = 2 * len(ops) * policy_op_time
    always = {True: _unkept_time(ops, unreplayed) + policy, False: _unkept_time(ops, {}) + policy}
    free = {len(ops) - 1} if name is not None and name not in unreplayed else None
    ending = [
        item
        for item in save_items(ops, free, offload_time)
        if not all(n in unreplayed for n in item.ops)
    ]
    options: dict[tuple[tuple[str, ...], tuple[str, ...]], Selection] = {}
    for ends, items in ((True, ending), (False, save_items(ops, None, offload_time))):
        for selection in frontier(items, points, MENU_TOLERANCE):
            if not (selection.saved or selection.offloaded):
                continue
            time = selection.recompute_time + always[ends]
            if ends:
                size = selection.kept_bytes + (block.output_bytes if name in selection.saved else 0)
                selection = replace(selection, kept_bytes=size, recompute_time=time + skipped)
            else:
                selection = replace(selection, recompute_time=time)
            options.setdefault((selection.saved, selection.offloaded), selection)
    return sorted(options.values(), key=lambda s: (s.kept_bytes, s.recompute_time))


# Note [selective options under torch.compile]
#     Under compile a policy must keep every random op's outputs (Note [random ops under
#     torch.compile] in ``ckptplan.applying.policy``), and those are not the eager step's:
#     inductor's dropout returns its output and a boolean mask, where eager's CPU dropout fills a
#     float mask in place. So the chain cannot price a selective option of a block with random ops:
#     on the compiled-plan tests' model, keeping one matmul of a dropout block was priced at
#     2 MiB kept and kept all 4.5 MiB that the unchecked step keeps. Such a block is kept or
#     checkpointed whole, which replays its random numbers and is priced right.


def block_forward_ops(profile: Profile) -> list[list[OpRecord]]:
    """Each block's forward ops, in the order a selective policy sees them."""
    return block_forward_records(profile.ops, len(profile.blocks))


def _priced(block: BlockProfile, ops: list[OpRecord], dataflow: object) -> tuple[object, ...]:
    """Everything a block's menu is made of: blocks alike in it (repeated layers) share one.
    A compiled menu is made of the block's ``dataflow`` too."""
    return (
        dataflow,
        block.class_name,
        block.output_bytes,
        *(
            (
                o.op,
                o.output_bytes,
                o.saved_bytes,
                round(o.time, 12),
                o.random,
                o.inplace,
                o.mutated_later,
            )
            for o in ops
        ),
    )


def selective_menus(
    profile: Profile, points: int = MENU_POINTS, joined: bool = False, offload: bool = True
) -> list[list[Selection]]:
    """Per block, the selective options worth offering (none: plain checkpoint); ``offload``
    where it pays (Note [when offload pays] in ``ckptplan.devices``); ``joined`` (a compiled
    step): the options of blocks inside a region, as ``compiled_menu`` says."""
    device = get_device(profile.settings.device, profile.settings.compiled)
    index_of = {id(op): i for i, op in enumerate(profile.ops)}
    cache: dict[tuple[object, ...], list[Selection]] = {}
    menus = []
    for block, ops in zip(profile.blocks, block_forward_ops(profile), strict=True):
        flow = dataflow(ops, index_of) if profile.settings.compiled else None
        signature = _priced(block, ops, flow)
        if signature not in cache:
            cache[signature] = _menu(
                block,
                ops,
                points,
                device.offload_time if offload else None,
                profile.policy_op_time,
                compiled=profile.settings.compiled,
                index_of=index_of,
                joined=joined,
            )
        menus.append(cache[signature])
    return menus
