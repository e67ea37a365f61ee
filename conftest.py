"""The test tiers (README, "Tests"): ``-m "torchfree and not slow"`` runs, in about a minute
and with torch blocked, the tests of the stages that must not need it: the solvers' doctests,
the doctests of the torch-free ckptplan modules (``tests/test_torch_free.py`` lists them) and
the test modules that declare ``pytestmark = pytest.mark.torchfree``.
Blocking torch is what makes the tier a proof: a test in it that reaches torch fails, so
the declaration cannot drift from the truth.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.test_torch_free import TORCH_FREE

ROOT = Path(__file__).resolve().parent
DECLARED = "pytestmark = pytest.mark.torchfree"
collect_ignore = ["src", "ckptplan/solvers"]
"""Links to ``ckptplan/`` and ``solvers/`` (the install's layout, docs/development.md): their
modules are collected once, from where they live."""
TORCH_FREE_SOURCES = frozenset(
    ROOT.joinpath(*module.split(".")).with_suffix(".py")
    for module in TORCH_FREE
    if module.startswith("ckptplan.")
)


def _torch_free_tier(config: pytest.Config) -> bool:
    """``-m torchfree`` or ``-m "torchfree and not slow"`` (an expression that selects it)."""
    terms = config.option.markexpr.replace("(", " ").replace(")", " ").split()
    return "torchfree" in terms and "not torchfree" not in " ".join(terms)


def _torch_free(path: Path) -> bool:
    """Whether the tier collects ``path``: every solver module, the listed ckptplan modules,
    and the test modules that declare the mark."""
    if ROOT / "solvers" in path.parents:
        return True
    if ROOT / "ckptplan" in path.parents:
        return path in TORCH_FREE_SOURCES
    return DECLARED in path.read_text()


def pytest_configure(config: pytest.Config) -> None:
    if _torch_free_tier(config):
        sys.modules["torch"] = None  # type: ignore[assignment]  # any import of torch fails


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if not _torch_free_tier(config) or collection_path.suffix != ".py":
        return None
    if collection_path.name in ("__init__.py", "conftest.py"):
        return None
    return not _torch_free(collection_path)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The doctests of torch-free modules join the tier (a doctest carries no marks)."""
    for item in items:
        if isinstance(item, pytest.DoctestItem) and _torch_free(item.path):
            item.add_marker(pytest.mark.torchfree)
