"""Write a module made by ``ckptplan.rewrite`` as a standalone Python file, and the functions
the rewritten code calls (which the file defines too, so that it needs only torch).

The model's class rebuilds the model's whole module tree at the original paths, in the
original order, so the file's ``state_dict`` has the model's keys: a module the forward calls
is rebuilt by its torch constructor (or, where its repr is not one, from its configuration),
every other module is an empty container of its own parameters and buffers. A region's class
holds nothing but its nested regions: the modules it runs come in as arguments.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import math
import re
import types
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.fx.graph import _custom_builtins

from ckptplan.applying import policy as policy_runtime
from ckptplan.applying.policy import selective
from ckptplan.errors import CkptplanError
from ckptplan.rewriting.runtime import if_training, norm_once
from ckptplan.values.policy_types import OpCall

_MODULE_ATTRIBUTES = frozenset(torch.nn.Module().__dict__)


@dataclass(frozen=True)
class RegionInfo:
    """A region as the rewritten module holds it: its submodule, paths and saved ops."""

    name: str
    modules: tuple[str, ...]
    saves: tuple[OpCall, ...] | None
    nested: tuple[RegionInfo, ...] = ()


def source(module: torch.fx.GraphModule, weights: str = "model_ckpt.pt") -> str:
    """The standalone Python source of a rewritten module; ``weights`` is its default path,
    relative to the file.
    """
    writer = _Writer(module.ckptplan_leaves)
    regions: tuple[RegionInfo, ...] = module.ckptplan_regions
    main = f"Checkpointed{module.ckptplan_model}"
    writer.classes(module, main, regions)
    lines = [
        f'"""{module.ckptplan_model} with activation checkpointing, written by ckptplan rewrite.',
        "",
        f"{module.ckptplan_plan}.",
        "Checkpointed regions: each keeps only its inputs in forward and runs again in backward.",
        *(f"    {line}" for line in _region_lines(regions)),
        "",
        "The forward code was traced with torch.fx in train() and in eval(); where the two",
        "differ, it reads the module's training flag (if_training). build_model() loads the",
        f"weights from {weights} beside this file (state_dict keys: the original model's).",
        '"""',
        "",
        *writer.imports(),
        "",
        f"WEIGHTS = Path(__file__).parent / {weights!r}",
        f"TIED = {writer.tied(module)!r}",
        '"""Parameters shared by two paths: (path, the path it is the same tensor as)."""',
        "",
        "",
        _HELPERS.strip("\n"),
        *writer.helpers(),
        *writer.blocks,
        "",
        "",
        _BUILD.replace("MAIN", main).strip("\n"),
        "",
    ]
    return "\n".join(lines)


def _region_lines(regions: tuple[RegionInfo, ...], depth: int = 0) -> list[str]:
    lines = []
    for r in regions:
        policy = f"; saves {', '.join(map(str, r.saves))}" if r.saves else ""
        lines.append(f"{'  ' * depth}{r.name}: {' + '.join(r.modules)}{policy}")
        lines.extend(_region_lines(r.nested, depth + 1))
    return lines


class _Writer:
    """Collects the class definitions, imports and helpers of one written module."""

    def __init__(self, leaves: frozenset[str]) -> None:
        self.leaves = leaves
        """Paths of the modules the traced code calls (the others are only containers)."""
        self.blocks: list[str] = []
        self.globals: dict[str, Any] = {}
        self.needs_leaf = False
        self.called: set[Any] = set()
        """Which of our functions (``_OURS``) the code calls: the file defines its own."""

    def classes(
        self, module: torch.fx.GraphModule, name: str, regions: tuple[RegionInfo, ...]
    ) -> None:
        for region in regions:
            sub = module.get_submodule(region.name)
            self.classes(sub, type(sub).__name__, region.nested)
        doc = (
            f"Checkpointed region: {' + '.join(r.modules)}."
            if (r := _region_of(module))
            else "The model; its regions are called through torch.utils.checkpoint."
        )
        code = module.graph.python_code(root_module="self")
        src = code.src
        for key, value in code.globals.items():
            ours = next((f for f in _OURS if value is f), None)
            if ours is not None or isinstance(value, str):
                # a function of ours (the file defines its own), or an annotation fx spelled
                # as a string
                if ours is not None:
                    self.called.add(ours)
                replacement = ours.__name__ if ours is not None else value
                src = re.sub(rf"\b{re.escape(key)}\b", replacement, src)
            elif re.search(rf"(?<![\w.]){re.escape(key)}\b(?!\s*=[^=])", src):
                self.globals[key] = value
        classes = {r.name: type(module.get_submodule(r.name)).__name__ for r in regions}
        body = [f"class {name}(torch.nn.Module):", f'    """{doc}"""', ""]
        body += ["    def __init__(self) -> None:", "        super().__init__()"]
        body += [f"        {line}" for line in self._tree(module, classes)]
        body += [f"    {line}".rstrip() for line in src.strip().splitlines()]
        self.blocks += ["", "", *body]

    def _tree(self, module: torch.nn.Module, classes: dict[str, str]) -> list[str]:
        """Statements that rebuild ``module``'s tree in its registration order (the order of
        its state_dict): each region, each leaf the code calls, and every other module as a
        container of its own parameters and buffers (made even when empty: the code may read
        its training flag)."""
        lines: list[str] = []
        seen: dict[int, str] = {}

        def visit(owner: torch.nn.Module, prefix: str) -> None:
            for name, p in owner._parameters.items():
                if p is not None:
                    value = f"torch.nn.Parameter({_empty(p)}, requires_grad={p.requires_grad})"
                    lines.append(f"_put(self, {prefix + name!r}, {value})")
            for name, b in owner._buffers.items():
                if b is not None:
                    dropped = name in owner._non_persistent_buffers_set
                    persistent = ", persistent=False" if dropped else ""
                    lines.append(f"_put(self, {prefix + name!r}, {_empty(b)}{persistent})")
            for name, child in owner._modules.items():
                path = prefix + name
                if child is None:
                    continue
                if id(child) in seen:
                    lines.append(f"_put(self, {path!r}, _get(self, {seen[id(child)]!r}))")
                    continue
                seen[id(child)] = path
                if path in classes:
                    lines.append(f"_put(self, {path!r}, {classes[path]}())")
                elif path in self.leaves:
                    lines.append(f"_put(self, {path!r}, {self._leaf(child, path)})")
                else:
                    made = len(lines)
                    visit(child, path + ".")
                    if len(lines) == made:
                        lines.append(f"_put(self, {path!r}, torch.nn.Module())")

        visit(module, "")
        return lines

    def _leaf(self, module: torch.nn.Module, path: str) -> str:
        """A constructor call when it rebuilds the module exactly, else ``_leaf(...)``."""
        cls = type(module)
        name = _class_path(cls)
        call = f"{name}({module.extra_repr()})"
        try:
            with torch.device("meta"):
                rebuilt = eval(call, {"torch": torch, "inf": math.inf, "nan": math.nan})
        except Exception:
            rebuilt = None
        if rebuilt is not None and _signature(rebuilt) == _signature(module):
            return call
        self.needs_leaf = True
        config = {k: v for k, v in module.__dict__.items() if k not in _MODULE_ATTRIBUTES}
        tensors = {
            **{k: _tensor_spec(v, "parameter") for k, v in module._parameters.items()},
            **{k: _tensor_spec(v, "buffer") for k, v in module._buffers.items()},
        }
        children = {k: self._leaf(v, f"{path}.{k}") for k, v in module._modules.items() if v}
        parts = [
            name,
            _literal(config, path),
            "{" + ", ".join(f"{k!r}: {v}" for k, v in tensors.items()) + "}",
        ]
        if children:
            parts.append("{" + ", ".join(f"{k!r}: {v}" for k, v in children.items()) + "}")
        return f"_leaf({', '.join(parts)})"

    def imports(self) -> list[str]:
        python, torch_lines = {"from pathlib import Path"}, {"import torch"}
        if selective in self.called:
            for line in _runtime(policy_runtime)[0]:
                (torch_lines if line.split()[1].startswith("torch") else python).add(line)
        by_module = sorted(python, key=lambda line: line.split()[1])
        lines = [*by_module, "", *sorted(torch_lines, key=lambda i: (i != "import torch", i))]
        for name, value in sorted(self.globals.items()):
            if value is torch or vars(builtins).get(name) is value:
                continue
            lines.append(_import_line(name, value))
        return lines

    def helpers(self) -> list[str]:
        out = []
        if self.needs_leaf:
            out += ["", "", _LEAF_HELPER.strip("\n")]
        if selective in self.called:
            out += ["", "", _runtime(policy_runtime)[1]]
        for helper in (if_training, norm_once):
            if helper in self.called:
                out += ["", "", inspect.getsource(helper).strip("\n")]
        return out

    def tied(self, module: torch.nn.Module) -> list[tuple[str, str]]:
        first: dict[int, str] = {}
        pairs = []
        for name, p in module.named_parameters(remove_duplicate=False):
            if id(p) in first:
                pairs.append((name, first[id(p)]))
            else:
                first[id(p)] = name
        return pairs


_OURS = (selective, if_training, norm_once)
"""The functions of ours that the traced code calls."""


def _runtime(module: types.ModuleType) -> tuple[list[str], str]:
    """A runtime module as a written file copies it: its import lines, and all its code after
    them."""
    text = inspect.getsource(module)
    imports = [n for n in ast.parse(text).body if isinstance(n, ast.Import | ast.ImportFrom)]
    after = max(n.end_lineno or n.lineno for n in imports)
    return [ast.unparse(n) for n in imports], "\n".join(text.splitlines()[after:]).strip("\n")


def _region_of(module: torch.nn.Module) -> RegionInfo | None:
    return getattr(module, "ckptplan_region", None)


def _class_path(cls: type) -> str:
    if getattr(torch.nn, cls.__name__, None) is cls:
        return f"torch.nn.{cls.__name__}"
    if cls.__module__.startswith("torch.") and "<" not in cls.__qualname__:
        return f"{cls.__module__}.{cls.__qualname__}"
    raise CkptplanError(
        f"{cls.__qualname__} is not a torch module, so the written file could not build it "
        "(rewrite keeps a module whose forward takes another path in eval() than in train()); "
        "use the module ckptplan.rewrite returns, or ckptplan.apply, on this model"
    )


def _signature(module: torch.nn.Module) -> Any:
    """What must match for a rebuilt module to behave as the original."""
    config = {k: repr(v) for k, v in module.__dict__.items() if k not in _MODULE_ATTRIBUTES}
    tensors = {
        k: None if v is None else (tuple(v.shape), v.dtype, v.requires_grad)
        for k, v in [*module._parameters.items(), *module._buffers.items()]
    }
    children = {k: _signature(v) for k, v in module._modules.items() if v is not None}
    return type(module), config, tensors, sorted(module._non_persistent_buffers_set), children


def _tensor_spec(value: torch.Tensor | None, kind: str) -> str:
    if value is None:
        return "None"
    return f"({kind!r}, {tuple(value.shape)!r}, {value.dtype}, {value.requires_grad})"


def _empty(value: torch.Tensor) -> str:
    return f"torch.empty({tuple(value.shape)!r}, dtype={value.dtype})"


def _literal(value: Any, path: str) -> str:
    """Python source for a configuration value; refuses what would not round-trip."""
    if value is None or isinstance(value, bool | int | str):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    if isinstance(value, tuple | list):
        items = ", ".join(_literal(v, path) for v in value)
        return (
            f"({items},)"
            if isinstance(value, tuple) and len(value) == 1
            else (f"({items})" if isinstance(value, tuple) else f"[{items}]")
        )
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_literal(v, path)}" for k, v in value.items()) + "}"
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    module = getattr(value, "__module__", "") or ""
    if callable(value) and module.startswith("torch") and hasattr(value, "__qualname__"):
        return f"{module}.{value.__qualname__}"
    raise CkptplanError(
        f"{path} holds a {type(value).__name__}, which the written file cannot rebuild; "
        "use ckptplan.apply on this model"
    )


def _import_line(name: str, value: Any) -> str:
    builtin = _custom_builtins.get(name)
    if builtin is not None and builtin.obj is value:
        return builtin.import_str
    if isinstance(value, types.ModuleType):
        return f"import {value.__name__} as {name}" if value.__name__ != name else f"import {name}"
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if module and qualname and "." not in qualname and "<" not in qualname:
        alias = "" if qualname == name else f" as {name}"
        return f"from {module} import {qualname}{alias}"
    raise CkptplanError(
        f"the traced code refers to {name} ({type(value).__name__}), "
        "which the written file cannot import; use ckptplan.apply"
    )


_HELPERS = '''

def _get(root: torch.nn.Module, path: str) -> object:
    for part in path.split("."):
        root = getattr(root, part)
    return root


def _put(root: torch.nn.Module, path: str, value: object, persistent: bool = True) -> None:
    """Set a submodule, parameter or buffer by dotted path, making empty parents as needed
    (a buffer that is not in the state_dict stays out of it)."""
    *parents, name = path.split(".")
    for part in parents:
        if part not in root._modules:
            root.add_module(part, torch.nn.Module())
        root = root._modules[part]
    if isinstance(value, torch.nn.Module | torch.nn.Parameter):
        setattr(root, name, value)
    else:
        persistent = persistent and name not in root._non_persistent_buffers_set
        root.register_buffer(name, value, persistent=persistent)
'''

_LEAF_HELPER = '''
def _leaf(cls: type, config: dict, tensors: dict, children: dict | None = None) -> torch.nn.Module:
    """A torch module with this configuration and empty tensors, without running __init__."""
    module = cls.__new__(cls)
    torch.nn.Module.__init__(module)
    module.__dict__.update(config)
    for name, spec in tensors.items():
        if spec is None:
            module.register_parameter(name, None)
            continue
        kind, shape, dtype, requires_grad = spec
        empty = torch.empty(shape, dtype=dtype)
        if kind == "parameter":
            module.register_parameter(name, torch.nn.Parameter(empty, requires_grad))
        else:
            module.register_buffer(name, empty)
    for name, child in (children or {}).items():
        module.add_module(name, child)
    return module
'''

_BUILD = '''
def build_model(weights: str | Path = WEIGHTS) -> torch.nn.Module:
    """The checkpointed model with its weights (built on meta, then the weights assigned)."""
    with torch.device("meta"):
        model = MAIN()
    tensors = torch.load(weights, weights_only=True)
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    if missing:
        raise RuntimeError(f"{weights} lacks {', '.join(missing)}")
    for name in unexpected:
        _put(model, name, tensors[name])
    for name, same in TIED:
        _put(model, name, _get(model, same))
    return model
'''
