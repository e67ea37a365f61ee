"""Module boundaries of the ckptplan package, read from the source with ``ast`` (no torch):
no module reaches into another's private names, none grows past 400 lines, the runtime that
applies a plan imports none of the planner, no stage of the planner imports a later one, and
no modules import each other in a cycle.

A private name is a module's own business, free to change without a look at any other file;
a module that needs one should have it made public where it lives. A module over 400 lines
does more than one job. A training job that applies a plan loads only the runtime, so a break
in the planner (its private torch, ortools) cannot break training
(``tests/test_runtime_imports.py`` runs it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.torchfree

PACKAGE = Path(__file__).resolve().parent.parent / "ckptplan"
SOLVERS = PACKAGE.parent / "solvers"
"""Installed as ``ckptplan.solvers``: held to the line limit too."""
MAX_LINES = 400
RUNTIME = ("ckptplan.train_api", "ckptplan.applying")
"""What ``ckptplan.apply(model, plan)`` runs: ``train_api`` and every module of ``applying/``."""
PLANNER = (
    "profiling",
    "stepping",
    "planning",
    "verifying",
    "cli",
    "api",
    "rewriting",
    "plancache",
    "loading",
)
"""The planner's modules and packages, under ``ckptplan``: the runtime imports none of them."""
STAGES = ("profiling", "stepping", "planning", "rewriting", "verifying")
"""The planner's stages in the order a plan flows through them: each imports its own and
earlier stages only. ``stepping`` runs a training step, planned or not, eager or compiled,
and takes its peak: planning confirms a candidate plan with it, verifying measures with it.
The runtime (``applying/``) and the value types (``values/``) lie below every stage; ``api``,
``cli`` and the other entry points above them all."""
VALUES = ("ckptplan.values", "ckptplan.errors")
"""What the value types may import of ckptplan: one another and the error type, no more, so
that every stage and the runtime can read them."""


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _dotted(path: Path) -> str:
    parts = ("ckptplan", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str) -> bool:
    relative = Path(*dotted.split(".")[1:])
    return (PACKAGE / relative).with_suffix(".py").is_file() or (PACKAGE / relative).is_dir()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _absolute(node: ast.ImportFrom, path: Path) -> str:
    """The module an import reads from, relative imports resolved against ``path``."""
    if not node.level:
        return node.module or ""
    package = _dotted(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _dotted_name(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for anything but a chain of names."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        inner = _dotted_name(node.value)
        return None if inner is None else [*inner, node.attr]
    return None


def private_uses(source: str, path: Path) -> Iterator[str]:
    """Each use in ``source`` (the module at ``path``) of another ckptplan module's private
    name: imported by ``from``, or read as an attribute of an imported ckptplan module."""
    tree = ast.parse(source)
    own = _dotted(path)
    modules: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source_module = _absolute(node, path)
            if source_module.split(".")[0] != "ckptplan":
                continue
            for alias in node.names:
                full = f"{source_module}.{alias.name}"
                if _is_module(full):
                    modules[alias.asname or alias.name] = full
                if _private(alias.name) and source_module != own:
                    yield f"line {node.lineno}: from {source_module} import {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "ckptplan":
                    bound = alias.asname or alias.name.split(".")[0]
                    modules[bound] = alias.name if alias.asname else "ckptplan"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        chain = _dotted_name(node.value)
        if not chain or chain[0] not in modules:
            continue
        module = ".".join([modules[chain[0]], *chain[1:]])
        if module != own and _is_module(module):
            yield f"line {node.lineno}: {'.'.join(chain)}.{node.attr}"


def test_no_module_uses_another_modules_private_names() -> None:
    found = {_name(path): list(private_uses(path.read_text(), path)) for path in _modules()}
    assert {name: uses for name, uses in found.items() if uses} == {}


def test_no_module_is_over_the_line_limit() -> None:
    paths = [*_modules(), *sorted(SOLVERS.rglob("*.py"))]
    lines = {
        path.relative_to(PACKAGE.parent).as_posix(): len(path.read_text().splitlines())
        for path in paths
    }
    assert {name: n for name, n in lines.items() if n > MAX_LINES} == {}


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("from ckptplan.values.plan import _b\n", ["line 1: from ckptplan.values.plan import _b"]),
        ("from .values.plan import _b\n", ["line 1: from ckptplan.values.plan import _b"]),
        ("from ckptplan.values import plan\nplan._b(1)\n", ["line 2: plan._b"]),
        ("import ckptplan.values.plan as p\np._b\n", ["line 2: p._b"]),
        (
            "import ckptplan.values.plan\nckptplan.values.plan._b\n",
            ["line 2: ckptplan.values.plan._b"],
        ),
        ("from ckptplan.values.plan import Plan\n", []),
        ("from ckptplan import __version__\nimport torch\ntorch._C\n", []),
        ("from ckptplan.values.plan import Plan\nPlan._private\n", []),
        ("def _own():\n    pass\n_own()\n", []),
    ],
)
def test_private_uses_are_found(source: str, found: list[str]) -> None:
    assert list(private_uses(source, PACKAGE / "example.py")) == found


def _imported(node: ast.Import | ast.ImportFrom, path: Path) -> Iterator[str]:
    """The ckptplan modules an import statement runs: each named one and the packages above."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        source = _absolute(node, path)
        names = [source, *(f"{source}.{a.name}" for a in node.names)]
    run: dict[str, bool] = {}
    for name in names:
        parts = name.split(".")
        for end in range(1, len(parts) + 1):
            run[".".join(parts[:end])] = parts[0] == "ckptplan"
    yield from (dotted for dotted, ours in run.items() if ours and _is_module(dotted))


def _type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def imports(source: str, path: Path, *, anywhere: bool) -> Iterator[tuple[int, str]]:
    """(line, ckptplan module) of each import the module at ``path`` runs: at import time, or
    ``anywhere`` (in its functions too); never those under ``if TYPE_CHECKING``."""
    nodes = list(ast.parse(source).body)
    while nodes:
        node = nodes.pop(0)
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield from ((node.lineno, name) for name in _imported(node, path))
        elif isinstance(node, ast.If) and _type_checking(node):
            nodes.extend(node.orelse)
        elif anywhere or not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            nodes.extend(ast.iter_child_nodes(node))


def _path(dotted: str) -> Path:
    relative = PACKAGE / Path(*dotted.split(".")[1:])
    return relative / "__init__.py" if relative.is_dir() else relative.with_suffix(".py")


def _planner(dotted: str) -> bool:
    parts = dotted.split(".")
    return len(parts) > 1 and parts[1] in PLANNER


def planner_imports() -> list[str]:
    """Each chain of imports by which the runtime reaches the planner: every import a runtime
    module makes when imported, and every one in ``applying/``'s functions (which training
    runs), followed through the modules they import."""
    roots = [_dotted(p) for p in _modules() if _dotted(p).startswith(RUNTIME)]
    chains = {name: [name] for name in roots}
    queue = list(roots)
    found = []
    while queue:
        module = queue.pop(0)
        path = _path(module)
        anywhere = module.startswith("ckptplan.applying")
        for line, name in imports(path.read_text(), path, anywhere=anywhere):
            chain = [*chains[module][:-1], f"{module} (line {line})", name]
            if _planner(name):
                found.append(" -> ".join(chain))
            elif name not in chains:
                chains[name] = chain
                queue.append(name)
    return found


def test_the_runtime_imports_none_of_the_planner() -> None:
    assert planner_imports() == []


@pytest.mark.parametrize(
    ("source", "anywhere", "found"),
    [
        (
            "from ckptplan.profiling import training\n",
            False,
            ["ckptplan", "ckptplan.profiling", "ckptplan.profiling.training"],
        ),
        ("import ckptplan.api\n", False, ["ckptplan", "ckptplan.api"]),
        ("def f():\n    import ckptplan.api\n", False, []),
        ("def f():\n    import ckptplan.api\n", True, ["ckptplan", "ckptplan.api"]),
        ("if TYPE_CHECKING:\n    import ckptplan.api\n", True, []),
        ("import torch\n", True, []),
    ],
)
def test_imports_are_found(source: str, anywhere: bool, found: list[str]) -> None:
    names = [name for _, name in imports(source, PACKAGE / "example.py", anywhere=anywhere)]
    assert names == found


def _named(node: ast.Import | ast.ImportFrom, path: Path) -> Iterator[str]:
    """The ckptplan modules an import statement names (not the packages above them)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        source = _absolute(node, path)
        names = [f"{source}.{a.name}" for a in node.names]
        names = [name if _is_module(name) else source for name in names]
    yield from (n for n in dict.fromkeys(names) if n.split(".")[0] == "ckptplan" and _is_module(n))


def import_graph(sources: dict[Path, str]) -> dict[str, dict[str, int]]:
    """module -> {ckptplan module it imports: first line}, every import counted: in functions
    and under ``if TYPE_CHECKING`` too (a type-only import is still a dependency)."""
    graph: dict[str, dict[str, int]] = {}
    for path, source in sources.items():
        edges = graph.setdefault(_dotted(path), {})
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for name in _named(node, path):
                    if name != _dotted(path):
                        edges.setdefault(name, node.lineno)
    return graph


def _stage(dotted: str) -> int | None:
    parts = dotted.split(".")
    return STAGES.index(parts[1]) if len(parts) > 2 and parts[1] in STAGES else None


def upward_imports(graph: dict[str, dict[str, int]]) -> dict[str, int]:
    """Each import by a stage of the planner of a later stage, ``file imports X``, and its line."""
    found = {}
    for module, edges in graph.items():
        here = _stage(module)
        for name, line in edges.items():
            there = _stage(name)
            if here is not None and there is not None and there > here:
                found[f"{_path(module).relative_to(PACKAGE.parent).as_posix()} imports {name}"] = (
                    line
                )
    return found


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others (each group
    sorted): the strongly connected components of more than one module, by Tarjan's method."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for name in graph.get(module, {}):
            if name not in index:
                visit(name)
                low[module] = min(low[module], low[name])
            elif name in stack:
                low[module] = min(low[module], index[name])
        if low[module] == index[module]:
            group = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def _package_graph() -> dict[str, dict[str, int]]:
    return import_graph({path: path.read_text() for path in _modules()})


def test_no_stage_of_the_planner_imports_a_later_one() -> None:
    assert upward_imports(_package_graph()) == {}


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == package or name.startswith(f"{package}.") for package in packages)


def test_the_values_import_only_values() -> None:
    graph = _package_graph()
    found = {
        f"{module} imports {name}": line
        for module, edges in graph.items()
        if _within(module, VALUES[:1])
        for name, line in edges.items()
        if not _within(name, VALUES)
    }
    assert found == {}


def test_no_modules_import_each_other() -> None:
    assert cycles(_package_graph()) == []


def _example_graph(files: dict[str, str]) -> dict[str, dict[str, int]]:
    return import_graph({PACKAGE / name: source for name, source in files.items()})


def test_upward_imports_and_cycles_are_found() -> None:
    graph = _example_graph(
        {
            "profiling/profiler.py": "from ckptplan.applying.tensors import first_tensor\n",
            "planning/search.py": "import ckptplan.profiling.profiler\n\n"
            "def f():\n    from ckptplan.verifying import sweep\n",
            "rewriting/codegen.py": "if TYPE_CHECKING:\n"
            "    from ckptplan.rewriting.graph import RegionInfo\n",
            "rewriting/graph.py": "from ckptplan.rewriting.codegen import source\n",
        }
    )
    assert upward_imports(graph) == {
        "ckptplan/planning/search.py imports ckptplan.verifying.sweep": 4
    }
    assert cycles(graph) == [["ckptplan.rewriting.codegen", "ckptplan.rewriting.graph"]]
    del graph["ckptplan.rewriting.codegen"]["ckptplan.rewriting.graph"]
    assert cycles(graph) == []
