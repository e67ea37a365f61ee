"""Modules that enclose a run of units: candidates for nested checkpointing.

A stage of Swin or ResNet calls its blocks and then, maybe, some code of its own (the patch
merging that halves the resolution). Checkpointing the stage whole *and* each block again
inside it (Hugging Face does exactly this for Swin: ``SwinStage`` and ``SwinLayer`` are both
checkpointing layers) keeps only the stage's input through forward, only the blocks' inputs
while the stage is recomputed, and one block's activations at a time in backward. It also
drops what the stage's own code saves, which no plan of the blocks alone can.

The chain model can price that exactly only for a module whose one call runs units
``[start, end)`` back to back and nothing else, except code after the last unit that is all of
the code before the next unit (so the profile's gap phase is that code). Anything else (code
before the first unit, code between units, a second call) disqualifies the module: its
recomputation would hold what the model does not describe.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ckptplan.profiling.callhooks import unit_hooks
from ckptplan.profiling.memtrack import LiveStorageTracker
from ckptplan.values.profile_types import EnclosingModule
from ckptplan.values.unit_names import split_unit


@dataclass
class _Call:
    calls: int = 0
    entry: tuple[int, int] = (0, 0)
    """(ops dispatched, units started) when its forward began."""
    exit: tuple[int, int, int] = (0, 0, 0)
    """(ops dispatched, units started, units ended) when its forward returned."""


class EnclosureRecorder:
    """Watches the module calls around the units during the profiled step."""

    def __init__(
        self,
        model: torch.nn.Module,
        units: list[tuple[str, torch.nn.Module]],
        tracker: LiveStorageTracker,
    ) -> None:
        self.tracker = tracker
        self.units = [path for path, _ in units]
        self.unit_modules = [module for _, module in units]
        modules = dict(model.named_modules())
        paths = set(self.units)
        ancestors = {path[:i] for path in self.units for i, c in enumerate(path) if c == "." and i}
        self.candidates = {
            a: modules[a]
            for a in sorted(ancestors)
            if a in modules
            and a not in paths
            and not isinstance(modules[a], torch.nn.ModuleList | torch.nn.ModuleDict)
        }
        self.calls = {a: _Call() for a in self.candidates}
        self.starts: list[int | None] = [None] * len(units)
        self.ends: list[int | None] = [None] * len(units)
        self.started = 0
        self.ended = 0

    def hooks(self) -> Iterator[Any]:
        yield from unit_hooks(
            list(zip(self.units, self.unit_modules, strict=True)), self._unit_pre, self._unit_post
        )
        for path, module in self.candidates.items():
            yield module.register_forward_pre_hook(self._pre(path))
            yield module.register_forward_hook(self._post(path))

    def _unit_pre(self, index: int) -> Any:
        def hook(module: torch.nn.Module, args: Any) -> None:
            self.starts[index] = self.tracker.ops
            self.started += 1

        return hook

    def _unit_post(self, index: int) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            self.ends[index] = self.tracker.ops
            self.ended += 1

        return hook

    def _pre(self, path: str) -> Any:
        def hook(module: torch.nn.Module, args: Any) -> None:
            call = self.calls[path]
            call.calls += 1
            call.entry = (self.tracker.ops, self.started)

        return hook

    def _post(self, path: str) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            self.calls[path].exit = (self.tracker.ops, self.started, self.ended)

        return hook

    def enclosures(self) -> tuple[EnclosingModule, ...]:
        """The qualifying modules (see the module docstring), the deepest of equals kept."""
        found: dict[tuple[int, int, bool], str] = {}
        for path, call in self.calls.items():
            enclosure = self._qualifies(path, call)
            if enclosure is None:
                continue
            key = (enclosure.start, enclosure.end, enclosure.encloses_gap)
            if key not in found or path.count(".") > found[key].count("."):
                found[key] = path
        return tuple(EnclosingModule(path, *key) for key, path in sorted(found.items()))

    def _qualifies(self, path: str, call: _Call) -> EnclosingModule | None:
        if call.calls != 1:
            return None
        (entry_ops, start), (exit_ops, started, end) = call.entry, call.exit
        inside = [i for i, unit in enumerate(self.units) if unit.startswith(path + ".")]
        if started != end or end <= start or inside != list(range(start, end)):
            return None
        if any(split_unit(self.units[i])[1] is not None for i in inside):
            return None  # its recomputation would call a shared module again, out of count
        starts, ends = self.starts, self.ends
        if None in starts[start:end] or None in ends[start:end] or starts[start] != entry_ops:
            return None
        if any(starts[j] != ends[j - 1] for j in range(start + 1, end)):
            return None
        after = exit_ops != ends[end - 1]
        if after and (end >= len(self.units) or starts[end] != exit_ops):
            return None
        if end - start < 2 and not after:
            return None
        return EnclosingModule(path, start, end, after)
