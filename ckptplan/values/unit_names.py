"""Names of units: a module's path, or, for a module that runs several times in one step, the
path and which of its calls (``encoder.shared#2``: the third call of ``encoder.shared``).

A unit is a module *call*: ALBERT's one shared layer runs once per layer, a contrastive
backbone once per view, and each of those calls can be checkpointed on its own. Calls are
counted from 0 within one forward of the model. Plain data, importable without torch.

>>> unit_name("layer", 2), unit_name("head", None)
('layer#2', 'head')
>>> split_unit("layer#2"), split_unit("head")
(('layer', 2), ('head', None))
"""

from __future__ import annotations

CALL_MARK = "#"


def unit_name(path: str, call: int | None) -> str:
    """The unit of ``path``'s call ``call``; None: the module's only call, named by its path."""
    return path if call is None else f"{path}{CALL_MARK}{call}"


def split_unit(name: str) -> tuple[str, int | None]:
    """``(module path, call index or None)`` of a unit name."""
    path, mark, call = name.rpartition(CALL_MARK)
    if not mark or not call.isdigit():
        return name, None
    return path, int(call)
