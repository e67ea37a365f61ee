"""A block's selective options priced as ``torch.compile``'s partitioner carries them out.

In eager mode a selective policy caches the output of every op it is told to save, and the
block's recomputation runs every other op. Under compile the policy's tags only *allow*: the
partitioner hands backward the values it reads, each saved where it is tagged, else rebuilt
from saved values and the block's input, and an op whose output nothing needs back is neither
saved nor recomputed (Note [what a compiled policy costs]). So an option's bytes are those of
the tagged values backward reaches, and its time that of the ops it rebuilds: a closure over
the block's dataflow (``OpRecord.inputs``) from the values autograd saves
(``OpRecord.saved_for_backward``).

Example: a block ``mm -> gelu -> mm``. Backward reads the first matmul's output (gelu's
input) and gelu's output (the second matmul's input), never the second matmul's output.

    >>> graph = BlockGraph(
    ...     names=("mm#0", "gelu#0", "mm#1"), sizes=(40, 40, 10), times=(5.0, 0.5, 5.0),
    ...     producers=((), (0,), (1,)), needed=frozenset({0, 1}), keepable=frozenset({0, 1, 2}),
    ... )
    >>> graph.price(frozenset({0}))   # keep mm#0's output, rebuild gelu's from it
    (('mm#0',), 40, 0.5)
    >>> graph.price(frozenset({0, 2}))   # mm#1's output is never read back: not kept
    (('mm#0',), 40, 0.5)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ckptplan.solvers.selective import Selection, thin
from ckptplan.values.profile_types import OpRecord

PEELED_OPS = 96
"""Blocks with up to this many keepable ops also get the greedy peel's options (its cost
grows with the cube of that count); larger ones only have the eager menu's choices repriced."""


@dataclass(frozen=True)
class BlockGraph:
    """One block's forward ops as values: positions index ``names``."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    """Output bytes of each op."""
    times: tuple[float, ...]
    producers: tuple[tuple[int, ...], ...]
    """Positions of the ops in the block whose outputs each op reads."""
    needed: frozenset[int]
    """Ops whose outputs backward reads back (or, inside a segment, the next block's
    recomputation: the block's output)."""
    keepable: frozenset[int]
    free: frozenset[int] = frozenset()
    """Ops whose outputs are kept anyway (a segment's last block's output: the next input)."""

    @staticmethod
    def of(
        ops: Sequence[OpRecord],
        names: Sequence[str],
        index_of: dict[int, int],
        keepable: Iterable[int],
        output: int | None,
        ends_segment: bool,
    ) -> BlockGraph:
        """The graph of a block's ``ops``, found in the step's records by ``index_of`` (id of a
        record -> its index); ``output``: the position of the op making the block's output."""
        flow = dataflow(ops, index_of)
        needed = {i for i, (read_back, _) in enumerate(flow) if read_back}
        free: frozenset[int] = frozenset()
        if output is not None:
            if ends_segment:
                free = frozenset({output})
            else:
                needed.add(output)
        return BlockGraph(
            names=tuple(names),
            sizes=tuple(op.output_bytes for op in ops),
            times=tuple(op.time for op in ops),
            producers=tuple(producers for _, producers in flow),
            needed=frozenset(needed),
            keepable=frozenset(keepable),
            free=free,
        )

    def price(self, tagged: frozenset[int]) -> tuple[tuple[str, ...], int, float]:
        """The ops whose outputs are kept with ``tagged`` ops saved, their bytes, and the time
        of rebuilding everything else backward reads."""
        kept, rebuilt = self.walk(tagged)
        size = sum(self.sizes[i] for i in kept if i not in self.free)
        time = sum(self.times[i] for i in rebuilt)
        return tuple(self.names[i] for i in sorted(kept - self.free)), size, time

    def walk(self, tagged: frozenset[int]) -> tuple[set[int], set[int]]:
        """From the values backward reads back, up the dataflow: the ops whose outputs are
        kept, and those rebuilt."""
        kept: set[int] = set()
        rebuilt: set[int] = set()
        stack = sorted(self.needed)
        while stack:
            i = stack.pop()
            if i in kept or i in rebuilt:
                continue
            if i in self.free or (i in tagged and i in self.keepable):
                kept.add(i)
                continue
            rebuilt.add(i)
            stack.extend(self.producers[i])
        return kept, rebuilt

    def peel(self) -> list[frozenset[int]]:
        """Tag sets from keeping every value backward reads to keeping none, each step
        untagging the op that frees the most bytes per second of rebuilding it adds."""
        tagged = self._reached(frozenset(self.keepable))
        steps = [tagged]
        while tagged:
            _, size, time = self.price(tagged)
            best, best_gain = None, -1.0
            for i in sorted(tagged):
                trial = self._reached(tagged - {i})
                _, trial_size, trial_time = self.price(trial)
                gain = (size - trial_size) / max(trial_time - time, 1e-12)
                if gain > best_gain:
                    best, best_gain = trial, gain
            assert best is not None
            tagged = best
            steps.append(tagged)
        return steps

    def _reached(self, tagged: frozenset[int]) -> frozenset[int]:
        """``tagged`` less the ops backward never reaches (and those kept anyway)."""
        kept, _ = self.walk(tagged)
        return frozenset((kept & tagged) - self.free)


def dataflow(
    ops: Sequence[OpRecord], index_of: dict[int, int]
) -> tuple[tuple[bool, tuple[int, ...]], ...]:
    """Per op of a block: whether backward reads its output back, and the positions in the
    block of the ops whose outputs it reads (``index_of``: id of a record -> its index in the
    step's records)."""
    local = {index_of[id(op)]: i for i, op in enumerate(ops)}
    return tuple(
        (op.saved_for_backward, tuple(local[j] for j in op.inputs if j in local)) for op in ops
    )


def compiled_options(
    graph: BlockGraph, seeds: Iterable[frozenset[int]], tail: frozenset[int], points: int
) -> list[Selection]:
    """A block's options under compile: the ``seeds`` (the eager menu's choices), and the
    greedy peel's where the block is small enough, each repriced by ``graph``; the Pareto
    frontier of them, thinned to ``points``.

    The ops in ``tail`` (past the block's last save) that an option neither keeps nor rebuilds
    are added to its time, the block's output among them: the chain takes every tail op an
    option does not tag off a segment's last block (``BlockOption.tail_time``)."""
    candidates = list(seeds)
    if len(graph.keepable) <= PEELED_OPS:
        candidates += graph.peel()
    priced: dict[tuple[str, ...], Selection] = {}
    for tagged in candidates:
        saved, size, time = graph.price(tagged)
        if not saved:
            continue
        kept, rebuilt = graph.walk(tagged)
        untouched = sum(graph.times[i] for i in tail - (kept - graph.free) - rebuilt)
        priced.setdefault(saved, Selection(saved, size, time + untouched))
    frontier, best = [], float("inf")
    for option in sorted(priced.values(), key=lambda s: (s.kept_bytes, s.recompute_time)):
        if option.recompute_time < best - 1e-15:
            frontier.append(option)
            best = option.recompute_time
    return thin(frontier, points)


def compiled_menu(
    ops: Sequence[OpRecord],
    names: Sequence[str],
    index_of: dict[int, int],
    keepable: Sequence[bool],
    output: str | None,
    tail: Iterable[str],
    seeds: Iterable[Sequence[str]],
    points: int,
    joined: bool = False,
) -> list[Selection]:
    """A block's menu under compile, for both places a block takes in a chain (ending its
    segment, or inside one): the ``seeds`` (the eager menu's saved ops) and the greedy peel's
    options, repriced; ``output`` names the op making the block's output, if any, and ``tail``
    the ops past the block's last save. ``joined``: only the options of a block inside a
    region, priced by what they rebuild alone (``ckptplan.planning.joined``)."""
    position = {n: i for i, n in enumerate(names)}
    tail_ops = frozenset() if joined else frozenset(position[n] for n in tail)
    tag_sets = [frozenset(position[n] for n in saved) for saved in seeds]
    options: dict[tuple[str, ...], Selection] = {}
    for ends in (False,) if joined else (True, False):
        graph = BlockGraph.of(
            ops,
            names,
            index_of,
            keepable=(i for i, k in enumerate(keepable) if k),
            output=None if output is None else position[output],
            ends_segment=ends,
        )
        for selection in compiled_options(graph, tag_sets, tail_ops, points):
            options.setdefault(selection.saved, selection)
    return sorted(options.values(), key=lambda s: (s.kept_bytes, s.recompute_time))


# Note [what a compiled policy costs]
#     On the ViT sample at compile's own 0.7 point, the partitioner kept 21 MiB a block where
#     the tags it was given (every matmul and the softmax) add up to 27 MiB: the projection's,
#     second MLP matmul's and score matmul's outputs are read by nothing in backward once the
#     softmax is saved. Priced as eager mode keeps them, that option looked barely smaller than
#     no checkpointing, and the solver checkpointed 7 blocks of 12 with the score matmul
#     recomputed instead (x1.049 of the compiled unchecked step, compile's own point x0.995, in
#     ``benchmarks/compile.py`` before this pricing). Those tags on every block, timed beside
#     compile's point in one process, ran at x0.994 against its x1.020, within its peak.
