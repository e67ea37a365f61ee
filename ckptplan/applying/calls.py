"""Which region a call of a shared module belongs to: calls counted per forward of the model.

A module that runs several times in one forward (ALBERT's shared layer, a backbone run on two
views) is planned call by call (``ckptplan.values.unit_names``). Its member ``__call__`` asks its
``CallRoute`` where call ``k`` of this forward goes; a call the plan does not name (one past the
calls the profile saw) runs plainly, unchecked, which never changes a gradient.

Counting restarts at each forward of the model (``StepStart``, a forward pre-hook on the root).
Under ``torch.compile`` the hook runs inside the traced forward and *writes* the counter before
any call reads it, so dynamo never guards on a count left by the previous step: the model
compiles once (``tests/test_module_reuse.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ckptplan.applying.region import RegionRun


class CallRoute:
    """The planned calls of one shared module: call index -> (region, member index)."""

    def __init__(self) -> None:
        self.targets: dict[int, tuple[RegionRun, int]] = {}
        self.made = 0
        """Calls of the module in this forward so far."""

    def next_call(self) -> tuple[RegionRun, int] | None:
        """Where the call starting now goes (None: run it unchecked), counted."""
        call = self.made
        self.made = call + 1
        return self.targets.get(call)


class StepStart:
    """The root's forward pre-hook: every shared module's count starts again at 0."""

    def __init__(self, routes: list[CallRoute]) -> None:
        self.routes = routes

    def __call__(self, module: torch.nn.Module, args: Any) -> None:
        for route in self.routes:
            route.made = 0
