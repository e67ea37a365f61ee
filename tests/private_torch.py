"""Private torch names in a module's source, read with ``ast``: what the runtime must not name.

A private name is one with a segment that starts with ``_`` (dunders aside) on a chain rooted at
torch: ``torch._C._foo``, ``from torch.utils._python_dispatch import X``, or a chain through a
name imported from torch (``from torch import overrides``; ``overrides._x``). ``torch.ops``
chains are operator names, which plans name, not torch's Python API. ``torch.utils._pytree`` is
allowed (the issue's one exception: the tree utilities every torch extension uses).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

ALLOWED_PREFIXES = ("torch.utils._pytree", "torch.ops.")

KEPT = {
    "torch.utils._python_dispatch.TorchDispatchMode": (
        "eager offload caches op outputs at dispatch, and TorchDispatchMode has no public home "
        "(torch 2.11 to 2.14; torch's docs import it from here): ckptplan/applying/offload.py, "
        "which only a plan that offloads in eager mode loads"
    ),
}
"""Private names the runtime keeps, each with the reason no public route serves."""


def _private(segment: str) -> bool:
    return segment.startswith("_") and not (segment.startswith("__") and segment.endswith("__"))


def _chain(node: ast.expr) -> list[str] | None:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        inner = _chain(node.value)
        return None if inner is None else [*inner, node.attr]
    return None


def _first_private(dotted: str) -> str | None:
    """``dotted`` cut after its first private segment; None when it has none or is allowed."""
    if dotted.startswith(ALLOWED_PREFIXES):
        return None
    parts = dotted.split(".")
    for end, part in enumerate(parts, 1):
        if _private(part):
            return ".".join(parts[:end])
    return None


def _bound(tree: ast.Module) -> Iterator[tuple[int, str, str]]:
    """(line, local name, torch path) of each name a torch import binds."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    local = alias.asname or "torch"
                    yield node.lineno, local, alias.name if alias.asname else "torch"
                    if not alias.asname:
                        yield node.lineno, "", alias.name  # the module path itself
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                yield node.lineno, alias.asname or alias.name, f"{node.module}.{alias.name}"


def private_torch(source: str) -> list[str]:
    """Each private torch name ``source`` uses, as ``line N: name``: an import's whole name, an
    attribute chain up to its first private segment."""
    tree = ast.parse(source)
    names: dict[str, str] = {}
    found: set[tuple[int, str]] = set()
    for line, local, path in _bound(tree):
        if local:
            names[local] = path
        if _first_private(path) is not None:
            found.add((line, path))
    for node in ast.walk(tree):
        chain = _chain(node) if isinstance(node, ast.Attribute) else None
        if chain and chain[0] in names:
            private = _first_private(".".join([names[chain[0]], *chain[1:]]))
            if private is not None:
                found.add((node.lineno, private))
    return [f"line {line}: {name}" for line, name in sorted(found)]
