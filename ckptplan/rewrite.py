"""Rewrite a model as a checkpointed ``torch.fx.GraphModule``, and write it out as Python.

``ckptplan.rewrite(model, plan)`` traces the model with ``torch.fx.symbolic_trace`` and moves
the code of each planned region (every node run inside its modules, plus the glue between
them) into a submodule named after it, ``ckpt_blocks_2_to_4``, which the traced forward calls
through ``torch.utils.checkpoint.checkpoint`` (non-reentrant, RNG state preserved, the
region's selective policy as ``context_fn``). Nested regions become submodules of their
region. Parameters are shared with the model, not copied.

``save(module, "model_ckpt.py")`` writes that module as a standalone file that needs only
torch: one class per region and one for the model, whose ``forward`` is the traced code, and a
``build_model()`` that loads the weights written beside it. A reader sees exactly what is
recomputed in backward. Models that do not trace (data-dependent Python, Hugging Face) get a
one-line error pointing to ``ckptplan.apply``, which checkpoints in place.

The module is callable: ``ckptplan.rewrite(model, plan)`` is ``ckptplan.rewrite.rewrite``.

Example:
    >>> module = ckptplan.rewrite(model, "plan.json")            # doctest: +SKIP
    >>> ckptplan.rewrite.save(module, "model_ckpt.py")            # doctest: +SKIP
"""

from __future__ import annotations

import builtins
import functools
import math
import operator
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch.fx.graph import _custom_builtins
from torch.utils.checkpoint import checkpoint

from ckptplan.budget import format_bytes
from ckptplan.errors import CkptplanError
from ckptplan.fingerprint import check_model_matches
from ckptplan.loading import load_model_file
from ckptplan.plan import Plan, Region, as_plan
from ckptplan.wrapping import _policy_saves, _refuse_wrapped, _selective_contexts

_MODULE_ATTRIBUTES = frozenset(torch.nn.Module().__dict__)


@dataclass(frozen=True)
class RegionInfo:
    """A region as the rewritten module holds it: its submodule, paths and saved ops."""

    name: str
    modules: tuple[str, ...]
    saves: tuple[str, ...] | None
    nested: tuple[RegionInfo, ...] = ()


def rewrite(
    model: torch.nn.Module, plan: Plan | str | Path, force: bool = False
) -> torch.fx.GraphModule:
    """``model`` traced, with each of ``plan``'s regions a checkpointed submodule.

    The refusals are ``apply``'s: a model already checkpointed or wrapped, or another model
    than the plan's (unless ``force``).
    """
    plan = as_plan(plan)
    if getattr(model, "ckptplan_applied", None) is not None:
        raise CkptplanError(
            f"{type(model).__name__} is checkpointed in place by ckptplan.apply; rewrite the "
            "model before applying a plan, not after"
        )
    _refuse_wrapped(model)
    check_model_matches(model, plan, force)
    try:
        traced = torch.fx.symbolic_trace(model)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CkptplanError(
            f"{type(model).__name__} does not trace with torch.fx ({type(exc).__name__}: "
            f"{first}); checkpoint it in place with ckptplan.apply(model, plan) instead"
        ) from None
    regions = tuple(_extract(traced, region) for region in plan.regions)
    _prune(traced)
    traced.ckptplan_regions = regions
    traced.ckptplan_model = type(model).__name__
    traced.ckptplan_plan = (
        f"Plan: solver {plan.solver}, budget {format_bytes(int(plan.budget['bytes']))}, predicted "
        f"peak {format_bytes(int(plan.predicted['peak_bytes']))}"
    )
    return traced


def _prune(module: torch.fx.GraphModule) -> None:
    """Drop the submodules the graph no longer uses (the regions' members moved into them).

    ``delete_all_unused_submodules`` would also drop the insides of a region reached by
    ``get_attr``, so this keeps everything under each referenced submodule, and it deletes
    only from the containers fx made: the model's own modules (shared) are never changed.
    """
    used = {""}
    for node in module.graph.nodes:
        if node.op not in ("call_module", "get_attr"):
            continue
        parts = str(node.target).split(".")
        used.update(".".join(parts[:k]) for k in range(1, len(parts) + 1))
        value = _attribute(module, str(node.target))
        if isinstance(value, torch.nn.Module):
            used.update(f"{node.target}.{name}" for name, _ in value.named_modules() if name)
    for name, _ in list(module.named_modules()):
        if name not in used and name.rpartition(".")[0] in used:
            module.delete_submodule(name)
    module.recompile()


def _region_name(modules: tuple[str, ...]) -> str:
    first = re.sub(r"\W", "_", modules[0])
    if len(modules) == 1:
        return f"ckpt_{first}"
    last = re.sub(r"\W", "_", modules[-1].rpartition(".")[2])
    return f"ckpt_{first}_to_{last}"


def _class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_") if part)


def _inside(node: torch.fx.Node, modules: tuple[str, ...]) -> bool:
    stack = node.meta.get("nn_module_stack") or {}
    return any(p == m or p.startswith(m + ".") for p in stack for m in modules)


def _region_nodes(graph: torch.fx.Graph, modules: tuple[str, ...]) -> list[torch.fx.Node]:
    """The nodes run inside the region's modules, and the glue between them, in graph order."""
    order = list(graph.nodes)
    inside = {n for n in order if _inside(n, modules)}
    if not inside:
        raise CkptplanError(
            f"region {'+'.join(modules)} runs no traced code; is the module called in forward?"
        )
    first = min(order.index(n) for n in inside)
    last = max(order.index(n) for n in inside)
    span = order[first : last + 1]
    after = set(inside)
    for node in span:
        if any(i in after for i in node.all_input_nodes):
            after.add(node)
    before = set(inside)
    for node in reversed(span):
        if any(u in before for u in node.users):
            before.add(node)
    chosen = inside | (after & before)
    return [n for n in order if n in chosen]


def _extract(owner: torch.fx.GraphModule, region: Region) -> RegionInfo:
    """Move ``region``'s code out of ``owner``'s graph into a checkpointed submodule."""
    name = _region_name(region.modules)
    label = "+".join(region.modules)
    saves = _policy_saves(region.policy, label)
    graph = owner.graph
    nodes = _region_nodes(graph, region.modules)
    chosen = set(nodes)
    inputs: list[torch.fx.Node] = []
    for node in nodes:
        for i in node.all_input_nodes:
            if i not in chosen and i not in inputs:
                inputs.append(i)
    outputs = [n for n in nodes if any(u not in chosen for u in n.users)]
    order = {n: k for k, n in enumerate(graph.nodes)}
    start = max([order[nodes[0]]] + [order[i] + 1 for i in inputs])
    users = [order[u] for n in outputs for u in n.users if u not in chosen]
    if any(k < start for k in users):
        raise CkptplanError(
            f"region {label} is interleaved with code outside it in the traced forward, so it "
            "cannot run as one checkpoint; re-solve with --max-segment 1"
        )
    body = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {i: body.placeholder(i.name) for i in inputs}
    for node in nodes:
        env[node] = body.node_copy(node, lambda n: env[n])
    body.output(env[outputs[0]] if len(outputs) == 1 else tuple(env[o] for o in outputs))
    sub = torch.fx.GraphModule(owner, body, class_name=_class_name(name))
    nested = tuple(_extract(sub, child) for child in region.children)
    _prune(sub)
    owner.add_submodule(name, sub)
    insert = list(graph.nodes)[start]
    with graph.inserting_before(insert):
        target = graph.get_attr(name)
        kwargs: dict[str, Any] = {"use_reentrant": False, "preserve_rng_state": True}
        if saves is not None:
            kwargs["context_fn"] = graph.create_node(
                "call_function", selective, (saves, label), name=f"{name}_policy"
            )
        call = graph.create_node(
            "call_function", checkpoint, (target, *inputs), kwargs, name=f"{name}_out"
        )
        results = (
            [call]
            if len(outputs) == 1
            else [graph.call_function(operator.getitem, (call, k)) for k in range(len(outputs))]
        )
    for old, new in zip(outputs, results, strict=True):
        old.replace_all_uses_with(new, delete_user_cb=lambda user: user not in chosen)
    for node in reversed(nodes):
        graph.erase_node(node)
    info = RegionInfo(name, region.modules, saves, nested)
    sub.ckptplan_region = info
    return info


def selective(saves: tuple[str, ...], region: str) -> functools.partial[tuple[Any, Any]]:
    """The ``context_fn`` of a region that keeps the ops in ``saves`` (``op#k`` or ``op``)."""
    return functools.partial(_selective_contexts, saves, region)


def source(module: torch.fx.GraphModule, weights: str = "model_ckpt.pt") -> str:
    """The standalone Python source of a rewritten module; ``weights`` is its default path,
    relative to the file.
    """
    writer = _Writer()
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
        "The forward code was traced with torch.fx in training mode. build_model() loads the",
        f"weights from {weights} beside this file (state_dict keys: this module's).",
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
        policy = f"; saves {', '.join(r.saves)}" if r.saves else ""
        lines.append(f"{'  ' * depth}{r.name}: {' + '.join(r.modules)}{policy}")
        lines.extend(_region_lines(r.nested, depth + 1))
    return lines


def save(
    module: torch.fx.GraphModule, path: str | Path, weights: str | Path | None = None
) -> tuple[Path, Path]:
    """Write the module's source to ``path`` and its weights beside it; both paths."""
    file = Path(path)
    weights_file = Path(weights) if weights is not None else file.with_suffix(".pt")
    relative = weights_file.name if weights_file.parent == file.parent else str(weights_file)
    file.write_text(source(module, relative))
    tensors = dict(module.state_dict())
    for name, buffer in module.named_buffers():
        tensors.setdefault(name, buffer)
    torch.save({k: v.detach().cpu() for k, v in tensors.items()}, weights_file)
    return file, weights_file


def rewrite_file(
    model_file: str | Path,
    plan: Plan | str | Path,
    output: str | Path,
    weights: str | Path | None = None,
    state_dict: str | Path | None = None,
    force: bool = False,
) -> tuple[torch.fx.GraphModule, Path, Path]:
    """``ckptplan rewrite``: the model file's model (with ``state_dict``'s weights if given)
    rewritten and saved; the module, the source file and the weights file.
    """
    workload = load_model_file(model_file)
    torch.manual_seed(0)
    model = workload.build()
    if state_dict is not None:
        _load_weights(model, Path(state_dict))
    module = rewrite(model, plan, force)
    source_file, weights_file = save(module, output, weights)
    return module, source_file, weights_file


def _load_weights(model: torch.nn.Module, path: Path) -> None:
    if not path.is_file():
        raise CkptplanError(f"state_dict file {path} not found")
    try:
        model.load_state_dict(torch.load(path, weights_only=True, map_location="cpu"))
    except (RuntimeError, KeyError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise CkptplanError(f"{path} does not fit the model: {first}") from None


class _Writer:
    """Collects the class definitions, imports and helpers of one written module."""

    def __init__(self) -> None:
        self.blocks: list[str] = []
        self.globals: dict[str, Any] = {}
        self.needs_leaf = False
        self.needs_policy = False

    def classes(
        self, module: torch.fx.GraphModule, name: str, regions: tuple[RegionInfo, ...]
    ) -> None:
        for region in regions:
            sub = module.get_submodule(region.name)
            self.classes(sub, type(sub).__name__, region.nested)
            self.needs_policy |= region.saves is not None
        doc = (
            f"Checkpointed region: {' + '.join(r.modules)}."
            if (r := _region_of(module))
            else "The model; its regions are called through torch.utils.checkpoint."
        )
        code = module.graph.python_code(root_module="self")
        src = code.src
        for key, value in code.globals.items():
            if value is selective or isinstance(value, str):
                # our policy helper, or a type annotation fx spelled as a string
                replacement = "selective" if value is selective else value
                src = re.sub(rf"\b{re.escape(key)}\b", replacement, src)
            elif re.search(rf"(?<![\w.]){re.escape(key)}\b(?!\s*=[^=])", src):
                self.globals[key] = value
        body = [f"class {name}(torch.nn.Module):", f'    """{doc}"""', ""]
        body += ["    def __init__(self) -> None:", "        super().__init__()"]
        body += [f"        {line}" for line in self._state(module, regions)]
        body += [f"    {line}".rstrip() for line in src.strip().splitlines()]
        self.blocks += ["", "", *body]

    def _state(self, module: torch.fx.GraphModule, regions: tuple[RegionInfo, ...]) -> list[str]:
        """Statements that build the submodules, parameters and buffers the code refers to."""
        classes = {r.name: type(module.get_submodule(r.name)).__name__ for r in regions}
        seen: dict[int, str] = {}
        lines = []
        for node in module.graph.nodes:
            if node.op not in ("call_module", "get_attr") or node.target in seen.values():
                continue
            target = str(node.target)
            value = _attribute(module, target)
            if id(value) in seen:
                lines.append(f"_put(self, {target!r}, _get(self, {seen[id(value)]!r}))")
            elif target in classes:
                lines.append(f"_put(self, {target!r}, {classes[target]}())")
            else:
                lines.append(f"_put(self, {target!r}, {self._value(value, target)})")
            seen[id(value)] = target
        return lines

    def _value(self, value: Any, path: str) -> str:
        if isinstance(value, torch.nn.Parameter):
            return f"torch.nn.Parameter({_empty(value)}, requires_grad={value.requires_grad})"
        if isinstance(value, torch.Tensor):
            return _empty(value)
        if isinstance(value, torch.nn.Module):
            return self._leaf(value, path)
        raise CkptplanError(f"cannot write {path} ({type(value).__name__}) as Python source")

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
        lines = ["from pathlib import Path", "", "import torch"]
        if self.needs_policy:
            lines[0:0] = ["import functools"]
            lines.append(
                "from torch.utils.checkpoint import CheckpointPolicy, "
                "create_selective_checkpoint_contexts"
            )
        for name, value in sorted(self.globals.items()):
            if value is torch or value is selective or vars(builtins).get(name) is value:
                continue
            lines.append(_import_line(name, value))
        return lines

    def helpers(self) -> list[str]:
        out = []
        if self.needs_leaf:
            out += ["", "", _LEAF_HELPER.strip("\n")]
        if self.needs_policy:
            out += ["", "", _POLICY_HELPER.strip("\n")]
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


def _region_of(module: torch.nn.Module) -> RegionInfo | None:
    return getattr(module, "ckptplan_region", None)


def _attribute(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _class_path(cls: type) -> str:
    if getattr(torch.nn, cls.__name__, None) is cls:
        return f"torch.nn.{cls.__name__}"
    if cls.__module__.startswith("torch.") and "<" not in cls.__qualname__:
        return f"{cls.__module__}.{cls.__qualname__}"
    raise CkptplanError(
        f"{cls.__qualname__} is not a torch module, so the written file could not build it; "
        "use ckptplan.apply on this model"
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


def _put(root: torch.nn.Module, path: str, value: object) -> None:
    """Set a submodule, parameter or buffer by dotted path, making empty parents as needed."""
    *parents, name = path.split(".")
    for part in parents:
        if part not in root._modules:
            root.add_module(part, torch.nn.Module())
        root = root._modules[part]
    if isinstance(value, torch.nn.Module | torch.nn.Parameter):
        setattr(root, name, value)
    else:
        root.register_buffer(name, value)
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

_POLICY_HELPER = '''
def selective(saves: tuple[str, ...], region: str) -> functools.partial:
    """A region's context_fn: selective checkpointing that keeps the ops in saves."""
    return functools.partial(_selective_contexts, saves)


def _selective_contexts(saves: tuple[str, ...]) -> tuple:
    """``op#k`` keeps the k-th call of op in the region (from 0), ``op`` every call."""
    ops = {}
    for entry in saves:
        name, _, index = entry.partition("#")
        namespace, op, overload = name.split(".")
        func = getattr(getattr(getattr(torch.ops, namespace), op), overload)
        ops.setdefault(func, set()).add(int(index) if index else None)
    counts = {False: {}, True: {}}

    def decide(ctx, func, *args, **kwargs):
        seen = counts[ctx.is_recompute]
        index = seen.get(func, 0)
        seen[func] = index + 1
        wanted = ops.get(func, ())
        if None in wanted or index in wanted:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(decide)
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


class _CallableModule(types.ModuleType):
    """Lets ``ckptplan.rewrite(model, plan)`` work though ``ckptplan.rewrite`` is this module."""

    def __call__(
        self, model: torch.nn.Module, plan: Plan | str | Path, force: bool = False
    ) -> torch.fx.GraphModule:
        return rewrite(model, plan, force)


sys.modules[__name__].__class__ = _CallableModule
