"""A plan's checkpointed regions as a person reads them: runs of like regions folded
(``blocks 3-12, a region each``), a module's later call named (``blocks 3-12 (second
call)``), and a selective policy as what it keeps and offloads (``keeps 6 tensors: 5 matmul
outputs, 1 attention output``), not as op calls (``mm#0, mm#1, …``).

>>> from ckptplan.values.policy_types import OpCall, Policy
>>> keeps = Policy((OpCall("aten.mm.default", 0), OpCall("aten.mm.default", 1)))
>>> regions = [Region(("b.0", "b.1")), *(Region((f"b.{i}",), policy=keeps) for i in (2, 3))]
>>> regions_words(regions)
'b 0-1 as one region; b 2-3, a region each (keeps 2 matmul outputs)'
>>> regions_words([Region((f"b.{i}",), calls=(1,)) for i in (0, 1, 2, 3)])
'b 0-3 (second call), a region each'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ckptplan.values.plan import Region
from ckptplan.values.policy_types import Choice, OpCall, Policy

_OP_WORDS = {
    ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear"): "matmul output",
    (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "scaled_dot_product_attention",
        "_efficient_attention_forward",
        "_flash_attention_forward",
    ): "attention output",
    (
        "mean",
        "var",
        "var_mean",
        "rsqrt",
        "native_layer_norm",
        "native_group_norm",
        "native_batch_norm",
        "_native_batch_norm_legit",
        "_native_batch_norm_legit_functional",
        "_native_batch_norm_legit_no_training",
    ): "norm statistic",
    ("_softmax", "_log_softmax", "softmax", "log_softmax"): "softmax output",
    ("convolution", "cudnn_convolution", "conv2d", "conv1d", "conv3d"): "convolution output",
    ("gelu", "silu", "relu", "sigmoid", "tanh", "hardtanh", "elu", "leaky_relu"): "activation",
    ("add", "sub", "mul", "div", "neg", "pow"): "elementwise result",
    ("native_dropout", "dropout", "bernoulli"): "dropout mask",
    ("embedding",): "embedding output",
    ("_to_copy", "to"): "dtype cast",
}
_WORD = {op: word for ops, word in _OP_WORDS.items() for op in ops}
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")
_SHOWN = 3
"""Kinds of tensor named per policy; more are counted as ``…``."""


def op_word(op: str) -> str:
    """What an op's output is, for a person: ``aten.mm.default`` -> ``matmul output``; an op
    outside the table keeps its name (``cat output``)."""
    name = op.split(".")[1] if op.count(".") >= 2 else op
    return _WORD.get(name, f"{name} output")


def tensors_words(calls: Sequence[OpCall]) -> str:
    """``2 norm statistics``, or of several kinds ``6 tensors: 5 matmul outputs, 1 attention
    output``, the most numerous first; a call of every call of its op reads ``every …``."""
    counts: dict[str, int] = {}
    every: list[str] = []
    for call in calls:
        word = op_word(call.op)
        if call.index is None:
            every.append(f"every {word}")
        else:
            counts[word] = counts.get(word, 0) + 1
    ranked = sorted(counts.items(), key=lambda item: -item[1])
    kinds = [f"{n} {word}{'s' if n > 1 else ''}" for word, n in ranked] + every
    if len(kinds) == 1:
        return kinds[0]
    shown = ", ".join(kinds[:_SHOWN]) + (", …" if len(kinds) > _SHOWN else "")
    total = sum(counts.values())
    return f"{total} tensors: {shown}" if total else shown


def policy_words(policy: Policy | None) -> str:
    """`` (keeps …; offloads …)`` of a selective region; empty for a plain one."""
    if policy is None:
        return ""
    parts = [
        f"{verb} {tensors_words(policy.calls(choice))}"
        for verb, choice in (("keeps", Choice.SAVE), ("offloads", Choice.OFFLOAD))
        if policy.calls(choice)
    ]
    return f" ({'; '.join(parts) or 'keeps nothing but its input'})"


def call_words(call: int | None) -> str:
    """`` (second call)`` of a module's later call; empty for its only one."""
    if call is None:
        return ""
    return f" ({_ORDINALS[call]} call)" if call < len(_ORDINALS) else f" (call {call + 1})"


@dataclass
class _Run:
    """Consecutive regions, each ``size`` numbered siblings of one call, under one policy."""

    parent: str
    first: int
    last: int
    size: int
    call: int | None
    policy: Policy | None
    count: int = 1

    def joins(self, other: _Run) -> bool:
        return (self.parent, self.last + 1, self.size, self.call, self.policy) == (
            other.parent,
            other.first,
            other.size,
            other.call,
            other.policy,
        )

    def words(self) -> str:
        if self.first == self.last:  # one module: its path
            name = f"{self.parent}.{self.first}" if self.parent else str(self.first)
            return name + call_words(self.call) + policy_words(self.policy)
        name = f"{self.parent or 'modules'} {self.first}-{self.last}{call_words(self.call)}"
        if self.count == 1:
            shape = " as one region"
        elif self.size == 1:
            shape = ", a region each"
        else:
            shape = f" in {self.count} regions of {self.size}"
        return name + shape + policy_words(self.policy)


def _run(region: Region) -> _Run | None:
    """The region as a run of one, where its members are consecutive numbered siblings of
    one call and it holds no regions inside it."""
    if region.children:
        return None
    calls = region.calls or (None,) * len(region.modules)
    parents, indices = set(), []
    for path in region.modules:
        parent, _, last = path.rpartition(".")
        if not last.isdigit():
            return None
        parents.add(parent)
        indices.append(int(last))
    if len(parents) != 1 or len(set(calls)) != 1:
        return None
    if indices != list(range(indices[0], indices[0] + len(indices))):
        return None
    return _Run(parents.pop(), indices[0], indices[-1], len(indices), calls[0], region.policy)


def _single(region: Region) -> str:
    calls = region.calls or (None,) * len(region.modules)
    names = [m + call_words(c) for m, c in zip(region.modules, calls, strict=True)]
    if region.children:
        return f"{names[0]} whole, with {regions_words(region.children)} inside it"
    name = names[0] if len(names) == 1 else f"{names[0]} to {names[-1]} as one region"
    return name + policy_words(region.policy)


def regions_words(regions: Sequence[Region]) -> str:
    """The regions in one line, runs of like regions folded; ``;`` between runs."""
    parts: list[_Run | str] = []
    for region in regions:
        run = _run(region)
        last = parts[-1] if parts else None
        if run is None:
            parts.append(_single(region))
        elif isinstance(last, _Run) and last.joins(run):
            last.last, last.count = run.last, last.count + 1
        else:
            parts.append(run)
    return "; ".join(part if isinstance(part, str) else part.words() for part in parts)
