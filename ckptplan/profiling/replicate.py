"""Repeated blocks priced once: a run of identical blocks is traced at three short lengths and
the profile of the whole run is extrapolated from them, exactly.

An 80-layer decoder's profile is 80 copies of one layer's figures, each shifted by what the
layers before it keep (forward) and what those after it left (gradients, in backward). So
instead of tracing all 80, the instrumented step runs with each run of identical blocks cut to
3, then 4, then 5 blocks (its first ``n - 1`` blocks and its last, children of their container
removed for the trace and put back after), and ``ckptplan.profiling.expand`` builds the profile of
any length from the first two traces.

Note (why it is exact): blocks of a run are *identical* here when they are consecutive children
of one ``ModuleList``/``Sequential``, of one class, with the same parameter and buffer shapes,
dtypes, strides and ``requires_grad`` (none shared with another module), each called once,
each taking the previous one's output with no op in between and the same other arguments
(tensors by identity), and when their forwards ran the same ops on the same shapes, with the
same flow of tensors between ops, parameters and inputs (``CallSignatures``, recorded on the
full model's warm-up step). Fake tensors carry no values, so identical blocks make identical
records; what differs between the blocks of a run is only where they sit, which shifts each
figure by a whole number of blocks' worth of bytes: every integer figure is affine in a
block's position and in the run's length. Two traces (lengths 3 and 4) fix those affine
maps; the third (length 5) must be reproduced exactly by them, field by field and op by op,
or the profile is traced whole instead (the profile's notes say which, and why).
``tests/test_replicated_profile.py`` checks the extrapolation against the full trace.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ckptplan.fingerprint import model_fingerprint
from ckptplan.profiling.expand import expanded
from ckptplan.profiling.runlayout import Layout, NotReplicable, owners_of_updates, renamed
from ckptplan.values.profile_types import Profile
from ckptplan.values.unit_names import split_unit

MIN_RUN = 16
"""The shortest run replicated: the three traces run 12 blocks, and the code outside the blocks
three times, so shorter runs are traced whole."""
LENGTHS = (3, 4, 5)
"""Run lengths of the base trace, the step trace and the check trace."""

Units = list[tuple[str, torch.nn.Module]]
_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential)


def _meta(t: torch.Tensor) -> tuple[Any, ...]:
    return (tuple(t.shape), t.stride(), t.dtype, t.storage_offset(), t.requires_grad)


@dataclass(eq=False)
class _Call:
    """One call of a container's child, as its forward ran (compared by identity)."""

    params: dict[int, int]
    """Storage key of each of its parameters and buffers -> its index."""
    first: int
    """Ops dispatched (anywhere) before it started."""
    input_id: int | None
    rest: tuple[Any, ...]
    """Its other arguments: tensors by identity, the rest by value."""
    last: int = 0
    output_id: int | None = None
    ops: list[tuple[Any, ...]] = field(default_factory=list)
    made: dict[int, int] = field(default_factory=dict)
    """Storage key -> index of the op that made it."""
    outside: dict[int, int] = field(default_factory=dict)
    """Storage key of a tensor from outside (its input, other arguments) -> order seen."""
    count: int = 1

    def tag(self, t: torch.Tensor) -> tuple[Any, ...]:
        key = t.untyped_storage()._cdata
        if key in self.made:
            source: tuple[Any, ...] = ("op", self.made[key])
        elif key in self.params:
            source = ("param", self.params[key])
        else:
            source = ("outside", self.outside.setdefault(key, len(self.outside)))
        return (*_meta(t), source)


class CallSignatures(TorchDispatchMode):
    """Records, for every child of every ``ModuleList``/``Sequential``, what its first call did:
    each op's name, arguments (tensors as shape, stride, dtype and where they came from) and
    outputs. Active only while such a child runs, so it costs nothing in backward."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.children = {
            f"{path}.{name}" if path else name: child
            for path, module in model.named_modules()
            if isinstance(module, _CONTAINERS)
            for name, child in module.named_children()
        }
        self.calls: dict[str, _Call] = {}
        self.ops = 0
        self._active: list[_Call] = []
        self._held: list[Any] = []

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        handles = []
        for path, module in self.children.items():
            handles.append(module.register_forward_pre_hook(self._pre(path), with_kwargs=True))
            handles.append(module.register_forward_hook(self._post(path), with_kwargs=True))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            if self._active:
                # A forward that raised skipped the hook that leaves the mode: leave it here,
                # or it stays on torch's mode stack (every later op, and torch.compile, see it).
                self._active.clear()
                self.__exit__(None, None, None)
            self._held.clear()

    def _pre(self, path: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            if path in self.calls:
                self.calls[path].count += 1
                return
            leaves = pytree.tree_leaves((args, kwargs))
            first = next((x for x in leaves if isinstance(x, torch.Tensor)), None)
            rest = tuple(
                ("tensor", id(x)) if isinstance(x, torch.Tensor) else x
                for x in leaves
                if x is not first
            )
            self._held.extend(leaves)
            tensors = [*module.parameters(), *module.buffers()]
            call = _Call(
                params={t.untyped_storage()._cdata: i for i, t in enumerate(tensors)},
                first=self.ops,
                input_id=None if first is None else id(first),
                rest=(str(pytree.tree_structure((args, kwargs))), *rest),
            )
            self.calls[path] = call
            if not self._active:
                self.__enter__()
            self._active.append(call)

        return hook

    def _post(self, path: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            call = self.calls[path]
            if call not in self._active:
                return
            self._active.remove(call)
            if not self._active:
                self.__exit__(None, None, None)
            out = next((x for x in pytree.tree_leaves(output) if isinstance(x, torch.Tensor)), None)
            call.last = self.ops
            call.output_id = None if out is None else id(out)
            self._held.append(out)

        return hook

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops += 1
        for call in self._active:
            arguments = tuple(
                call.tag(x) if isinstance(x, torch.Tensor) else x
                for x in pytree.tree_leaves((args, kwargs))
            )
            outputs = tuple(
                _meta(x) for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)
            )
            index = len(call.ops)
            call.ops.append((str(func), arguments, outputs))
            for x in pytree.tree_leaves(out):
                if isinstance(x, torch.Tensor):
                    call.made[x.untyped_storage()._cdata] = index
        return out


@dataclass(frozen=True)
class Run:
    """Identical blocks ``[first, first + length)`` of the chain, consecutive children of the
    container at ``container``."""

    container: str
    first: int
    length: int


def _static(module: torch.nn.Module) -> tuple[Any, ...]:
    return (
        type(module),
        tuple((n, *_meta(p)) for n, p in module.named_parameters()),
        tuple((n, *_meta(b)) for n, b in module.named_buffers()),
    )


def find_runs(
    model: torch.nn.Module, units: Units, signatures: CallSignatures, min_run: int
) -> list[Run]:
    """The runs of at least ``min_run`` identical blocks (see the module's Note)."""
    uses: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        uses[id(p)] = uses.get(id(p), 0) + 1
    containers = {
        path: module for path, module in model.named_modules() if isinstance(module, _CONTAINERS)
    }
    keys = {path: list(module._modules) for path, module in containers.items()}

    def place(path: str) -> tuple[str, int] | None:
        """Where the unit's module sits in its container; None for one call of a module that
        runs several times (calls of one module are never a run of blocks)."""
        parent, _, key = path.rpartition(".")
        if split_unit(path)[1] is not None or parent not in keys:
            return None
        return parent, keys[parent].index(key)

    def alike(a: int, b: int) -> bool:
        (pa, ma), (pb, mb) = units[a], units[b]
        ca, cb = signatures.calls.get(pa), signatures.calls.get(pb)
        where_a, where_b = place(pa), place(pb)
        return (
            ca is not None
            and cb is not None
            and where_a is not None
            and where_b == (where_a[0], where_a[1] + 1)
            and ca.count == cb.count == 1
            and ca.last == cb.first
            and cb.input_id is not None
            and cb.input_id == ca.output_id
            and ca.rest == cb.rest
            and _static(ma) == _static(mb)
            and ca.ops == cb.ops
        )

    def single(index: int) -> bool:
        return all(uses[id(p)] == 1 for p in units[index][1].parameters())

    runs: list[Run] = []
    start = 0
    for i in range(1, len(units) + 1):
        if i < len(units) and alike(i - 1, i) and single(i):
            continue
        if i - start >= min_run and single(start):
            runs.append(Run(units[start][0].rpartition(".")[0], start, i - start))
        start = i
    return runs


@contextlib.contextmanager
def truncated(
    model: torch.nn.Module, units: Units, run: Run, length: int
) -> Iterator[tuple[Units, Layout]]:
    """The model with the run cut to ``length`` blocks (its first ``length - 1`` and its last),
    and its chain; the container is put back on exit."""
    roles: list[tuple[int, int]] = []
    kept: list[int] = []
    dropped: set[str] = set()
    for index, (path, _) in enumerate(units):
        j = index - run.first
        if not 0 <= j < run.length:
            roles.append((-1, index))
            kept.append(index)
        elif j < length - 1 or j == run.length - 1:
            roles.append((0, min(j, length - 1)))
            kept.append(index)
        else:
            dropped.add(path.rpartition(".")[2])
    container = model.get_submodule(run.container)
    original = container._modules
    children = [(k, m) for k, m in original.items() if k not in dropped]
    numbered = all(k.isdigit() for k in original)
    new = OrderedDict((str(i) if numbered else k, m) for i, (k, m) in enumerate(children))
    prefix = f"{run.container}." if run.container else ""
    renames = {
        prefix + old: prefix + key
        for (old, _), key in zip(children, new, strict=True)
        if old != key
    }
    container._modules = new
    try:
        chain = [(renamed(units[i][0], renames), units[i][1]) for i in kept]
        yield chain, Layout(tuple(roles), length, tuple(p for p, _ in chain), renames)
    finally:
        container._modules = original


def replicated(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    units: Units,
    run: Run,
    trace: Callable[[Units], Profile],
) -> Profile:
    """The profile of the whole chain from the three short traces; ``NotReplicable`` when the
    third is not what the first two predict."""
    traces = []
    for n in LENGTHS:
        with truncated(model, units, run, n) as (chain, layout):
            profile = trace(chain)
            traces.append((profile, layout, owners_of_updates(optimizer, chain)))
            model.zero_grad(set_to_none=True)
    base, step, check = traces
    own = {"fingerprint": check[0].fingerprint, "modules": check[0].modules}
    predicted = expanded(base, step, check[1], own)
    if predicted != check[0]:
        raise NotReplicable(_first_difference(predicted, check[0]))
    layout = Layout(
        tuple(
            (0, i - run.first) if 0 <= i - run.first < run.length else (-1, i)
            for i in range(len(units))
        ),
        run.length,
        tuple(p for p, _ in units),
        {},
    )
    own = {
        "fingerprint": model_fingerprint(model),
        "modules": tuple(
            (path, type(m).__name__, sum(p.numel() for p in m.parameters()))
            for path, m in model.named_modules()
        ),
    }
    profile = expanded(base, step, layout, own)
    first, last = units[run.first][0], units[run.first + run.length - 1][0]
    note = (
        f"repeated blocks priced once: {first} to {last} ({run.length} identical blocks) "
        f"traced as {', '.join(map(str, LENGTHS))} blocks and extrapolated, exact against "
        f"the {LENGTHS[-1]}-block trace"
    )
    return replace(profile, notes=(*profile.notes, note))


def _first_difference(a: Profile, b: Profile) -> str:
    name = next((n for n in a.__dataclass_fields__ if getattr(a, n) != getattr(b, n)), "?")
    return f"the {LENGTHS[-1]}-block trace differs from its extrapolation in {name}"
