"""Per-op records of a training step: module path, bytes, FLOPs, time, and flags.

The flop counter of ``torch.utils.flop_counter`` knows matmuls and convolutions; CPU attention
(``_scaled_dot_product_flash_attention_for_cpu``) is added here. Pointwise and normalisation ops
count 0 FLOPs, so the bytes they move carry their time in the roofline estimate. With
``measure=True`` each op is also timed on the device it runs on (real tensors only).

Each record also names the records whose outputs it reads (``inputs``), so the step can be
rebuilt as an op graph (``ckptplan.planning.opgraph``). Tensors are matched by storage, so a view
reads its base's producer; after an in-place op, readers of that storage depend on the in-place op
(the latest writer). Only record indices are kept, never tensors or storages.
"""

from __future__ import annotations

import time
import weakref
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.module_tracker import ModuleTracker

from ckptplan.devices import Device, OpKind, op_kind
from ckptplan.profiling.memtrack import real_storage_bytes
from ckptplan.profiling.rnn import workspace_bytes
from ckptplan.values.phase import Phase
from ckptplan.values.profile_types import OpRecord


def _sdpa_cpu_flops(args: tuple[Any, ...], backward: bool) -> float:
    query, key = args[1 if backward else 0], args[2 if backward else 1]
    *batch, lq, d = query.shape
    lk = key.shape[-2]
    n = 1
    for b in batch:
        n *= b
    forward = 4.0 * n * lq * lk * d
    return 2.5 * forward if backward else forward


def op_flops(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> float:
    from torch.utils.flop_counter import flop_registry

    packet = func._overloadpacket
    if packet in flop_registry:
        return float(flop_registry[packet](*args, **kwargs, out_val=out))
    name = packet.__name__
    if name.startswith("_scaled_dot_product_flash_attention_for_cpu"):
        return _sdpa_cpu_flops(args, backward=name.endswith("backward"))
    return 0.0


def _output_bytes(func: Any, args: Any, out: Any) -> int:
    """Bytes of the op's outputs, a recurrent kernel's workspace at its real size (its fake
    kernel returns it empty, ``rnn``): a selective plan that keeps the op keeps it too."""
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() or workspace_bytes(func, args, t) for t in leaves)


def _bytes_moved(
    func: Any, args: Any, kwargs: dict[str, Any], out: Any, read: dict[int, None]
) -> int:
    """What the roofline's memory side moves: every tensor argument and output once, but
    nothing for an op that only allocates (``empty_like``) or only relabels its input
    (``_unsafe_view``: its outputs alias what it reads)."""
    if func._overloadpacket.__name__.startswith(("empty", "new_empty")):
        return 0
    outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    if (
        not func._schema.is_mutable
        and outs
        and all(t.untyped_storage()._cdata in read for t in outs)
    ):
        return 0
    return _moved_bytes((args, kwargs)) + _moved_bytes(out)


def _moved_bytes(tree: Any) -> int:
    """Bytes a kernel reads or writes for these tensors: an expanded tensor (a broadcast
    gradient) is read from its storage, not once per element it stands for."""
    return sum(_read_bytes(t) for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor))


def _read_bytes(tensor: torch.Tensor) -> int:
    nbytes = tensor.numel() * tensor.element_size()
    try:
        return min(nbytes, tensor.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # no storage of its own (sparse, subclasses)
        return nbytes


def record_kind(op: str, random: bool) -> OpKind:
    """The roofline class an op is priced in: random-number generation, or its own."""
    return "random" if random else op_kind(op)


def eager_seconds(ops: Sequence[OpRecord], device: Device, measured: bool) -> float:
    """Seconds of the ``ops`` outside the forward and backward passes (the optimizer step and
    the step's ends) on ``device``, or as ``measured``: a compiled step runs them eagerly,
    outside its graphs. Where the device models a cache, an op's bytes that fit it come from it
    (Note [the optimizer step runs from cache])."""
    return sum(
        op.time
        if measured
        else device.op_time(
            record_kind(op.op, op.random),
            op.flops,
            op.moved_bytes,
            op.half,
            cached=op.moved_bytes if op.moved_bytes <= device.cache_bytes else None,
        )
        for op in ops
        if Phase.parse(op.phase).direction is None
    )


# Note [the optimizer step runs from cache]
#     An optimizer updates one parameter at a time, and each of its ops rereads the same few
#     tensors: AdamW's seven run over the parameter, its gradient and two moments. So where
#     they fit the device's cache, all but the first touch come from it, and the first is
#     prefetched as the op streams. On the CPU, HF Llama's eager AdamW step (12x256, 13.7M
#     parameters) is priced at 118 ms from memory and measured at 57 ms, and HF ViT's at
#     48.5 ms against 24.5 ms; from the cache they are priced at 56 ms and 23 ms. A foreach
#     or fused optimizer's op moves many parameters' bytes at once, more than a cache holds,
#     and is priced from memory as before. The error sat in the step a compiled plan's
#     overhead is a fraction of, and read Llama's overheads 8% low.


def _is_random(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Draws random numbers: seeded ops, except attention called with ``dropout_p=0``."""
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    names = [a.name for a in func._schema.arguments]
    if "dropout_p" in names:
        index = names.index("dropout_p")
        p = kwargs.get("dropout_p", args[index] if index < len(args) else 0.0)
        return bool(p)
    return True


def _module_order(path: str) -> tuple[int, tuple[tuple[int, int | str], ...]]:
    parts = path.split(".")
    return len(parts), tuple((0, int(p)) if p.isdigit() else (1, p) for p in parts)


class OpRecorder(TorchDispatchMode):
    """Records every aten op with its phase (set by the caller's hooks) and module path."""

    def __init__(self, device: Device, modules: ModuleTracker, measure: bool = False) -> None:
        super().__init__()
        self.device = device
        self.modules = modules
        self.measure = measure
        self.phase = "start"
        self.records: list[OpRecord] = []
        self._producer: dict[int, OpRecord] = {}
        self._writer: dict[int, int] = {}
        """Storage key -> index of the latest record that wrote it (made it or in place)."""

    def _module_path(self) -> str:
        """The innermost module running (in backward several may be): the deepest, ties going
        to the one that comes later in the model (``layers.10`` after ``layers.9``), so that
        equal steps name equal modules whatever order the tracker's set holds them in."""
        names = [p for p in self.modules.parents if p != "Global"]
        innermost = max(names, key=_module_order, default="")
        return innermost.split(".", 1)[1] if "." in innermost else ""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        started = time.perf_counter() if self.measure else 0.0
        out = func(*args, **kwargs)
        if self.measure and isinstance(out, torch.Tensor) and out.is_cuda:
            torch.cuda.synchronize(out.device)
        elapsed = time.perf_counter() - started
        if func.namespace == "prim" or func.is_view:
            return out
        written = self._written_storages(func, args, kwargs)
        self._note_mutations(written)
        read = self._storages(args, kwargs)
        inputs = tuple(dict.fromkeys(self._writer[k] for k in read if k in self._writer))
        flops = op_flops(func, args, kwargs, out)
        moved = _bytes_moved(func, args, kwargs, out, read)
        half = any(
            isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16)
            for t in pytree.tree_leaves(out)
        )
        random = _is_random(func, args, kwargs)
        kind = record_kind(str(func), random)
        fresh: dict[int, torch.UntypedStorage] = {}
        fresh_bytes: dict[int, int] = {}
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                storage = leaf.untyped_storage()
                key = storage._cdata
                if key not in read and key not in self._writer:
                    fresh[key] = storage
                    fresh_bytes[key] = real_storage_bytes(func, args, leaf)
        self.records.append(
            OpRecord(
                op=str(func),
                phase=self.phase,
                module=self._module_path(),
                backward=self.modules.is_bw,
                output_bytes=_output_bytes(func, args, out),
                saved_bytes=0,
                flops=flops,
                time=elapsed if self.measure else self.device.op_time(kind, flops, moved, half),
                random=random,
                inplace=func._schema.is_mutable,
                inputs=inputs,
                allocated_bytes=sum(fresh_bytes.values()),
                overwritten_bytes=sum(
                    nbytes for key, nbytes in written.items() if key in self._writer
                ),
                moved_bytes=moved,
                half=half,
            )
        )
        index = len(self.records) - 1
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                storage = leaf.untyped_storage()
                key = storage._cdata
                if key not in self._producer:
                    self._producer[key] = self.records[-1]
                    weakref.finalize(storage, self._producer.pop, key, None)
        for key, storage in fresh.items():
            self._writer[key] = index
            weakref.finalize(storage, self._writer.pop, key, None)
        for key in written:
            if key in self._writer:
                self._writer[key] = index
        return out

    @staticmethod
    def _storages(args: Any, kwargs: dict[str, Any]) -> dict[int, None]:
        """Keys of the storages behind the tensor arguments, in argument order."""
        keys: dict[int, None] = {}
        for leaf in pytree.tree_leaves((args, kwargs)):
            if isinstance(leaf, torch.Tensor):
                keys[leaf.untyped_storage()._cdata] = None
        return keys

    @staticmethod
    def _written_storages(func: Any, args: Any, kwargs: dict[str, Any]) -> dict[int, int]:
        """Key -> bytes of the storages an in-place op writes (its mutable arguments)."""
        if not func._schema.is_mutable:
            return {}
        names = [a.name for a in func._schema.arguments if a.alias_info and a.alias_info.is_write]
        values = dict(zip((a.name for a in func._schema.arguments), args, strict=False))
        values.update(kwargs)
        out: dict[int, int] = {}
        for name in names:
            for leaf in pytree.tree_leaves(values.get(name)):
                if isinstance(leaf, torch.Tensor):
                    storage = leaf.untyped_storage()
                    out[storage._cdata] = storage.nbytes()
        return out

    def _note_mutations(self, written: dict[int, int]) -> None:
        """Flag the ops whose outputs an in-place op is overwriting now."""
        for key in written:
            producer = self._producer.get(key)
            if producer is not None:
                producer.mutated_later = True

    def note_saved(self, nbytes: int, key: int) -> None:
        """Autograd saved a tensor of storage ``key`` after the op just recorded and before
        the next one.

        Autograd saves an op's inputs before running it and its outputs after, so these are
        the next op's inputs or this op's outputs: the time order recomputation follows (it
        stops at the last save of a region). Saves in a new phase (the next block's first
        inputs) are not this op's. The op that wrote the storage is marked as one whose output
        backward reads.
        """
        if self.records and self.records[-1].phase == self.phase:
            self.records[-1].saved_bytes += nbytes
        if key in self._writer:
            self.records[self._writer[key]].saved_for_backward = True

    def totals(self) -> tuple[dict[str, float], dict[str, float]]:
        """FLOPs and time per phase."""
        return phase_totals(self.records)


def phase_totals(records: Sequence[OpRecord]) -> tuple[dict[str, float], dict[str, float]]:
    """FLOPs and time per phase, summed in record order (so equal records give equal sums)."""
    flops: dict[str, float] = defaultdict(float)
    seconds: dict[str, float] = defaultdict(float)
    for r in records:
        flops[r.phase] += r.flops
        seconds[r.phase] += r.time
    return flops, seconds
