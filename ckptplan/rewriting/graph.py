"""Rewrite a model as a checkpointed ``torch.fx.GraphModule``, and write it out as Python.

``ckptplan.rewrite(model, plan)`` traces the model with torch.fx and moves the code of each
planned region (every node run inside its modules, plus the glue between them) into a
submodule named after it, ``ckpt_blocks_2_to_4``, which the traced forward calls through
``torch.utils.checkpoint.checkpoint`` (non-reentrant, RNG state preserved, the region's
selective policy as ``context_fn``). Nested regions become submodules of their region.

What it keeps of the model:

- State. The module's tree is the model's own (the same modules, shared, at the same paths),
  so its ``state_dict`` has the model's keys in the model's order. A region holds no state:
  the top-level modules it runs (``blocks``) are passed to it, so each path names one thing.
- Behaviour in ``train()`` and ``eval()``. torch.nn modules (dropout, norms) stay modules the
  code calls, reading their own flag, and code that reads ``self.training`` reads it when it
  runs, not when it was traced (``ckptplan.rewriting.extract`` says how). A norm's running
  statistics are updated once per step, not again when backward recomputes its region.

``save(module, "model_ckpt.py")`` writes that module as a standalone file that needs only
torch (``ckptplan.rewriting.codegen``). Models that do not trace (data-dependent Python, Hugging
Face) get a one-line error pointing to ``ckptplan.apply``, which checkpoints in place.

``ckptplan.rewrite`` is this module, made callable: ``ckptplan.rewrite(model, plan)`` is
``ckptplan.rewrite.rewrite``.

Example:
    >>> module = ckptplan.rewrite(model, "plan.json")            # doctest: +SKIP
    >>> ckptplan.rewrite.save(module, "model_ckpt.py")            # doctest: +SKIP
"""

from __future__ import annotations

import operator
import re
import sys
import types
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch.fx.node import Node, map_arg
from torch.nn.modules.batchnorm import _NormBase
from torch.utils.checkpoint import checkpoint

from ckptplan.applying.install import refuse_wrapped
from ckptplan.applying.policy import selective
from ckptplan.errors import CkptplanError, option
from ckptplan.fingerprint import check_model_matches
from ckptplan.hub import HubModel
from ckptplan.huggingface import is_hub_name
from ckptplan.loading import load_model_file
from ckptplan.rewriting.codegen import RegionInfo, source
from ckptplan.rewriting.extract import trace
from ckptplan.rewriting.runtime import norm_once
from ckptplan.values.budget import format_bytes
from ckptplan.values.plan import Plan, Region, as_plan
from ckptplan.values.policy_types import OpCall, Policy

__all__ = ["RegionInfo", "rewrite", "rewrite_file", "save", "source"]


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
    refuse_wrapped(model)
    check_model_matches(model, plan, force)
    shared = next((r.units[0] for r in plan.regions if r.calls), None)
    if shared is not None:
        raise CkptplanError(
            f"the plan checkpoints {shared}, one call of a module that runs several times, "
            "which a rewrite cannot cut out of the traced forward; use ckptplan.apply(model, plan)"
        )
    root = trace(model)
    leaves = frozenset(str(n.target) for n in root.graph.nodes if n.op == "call_module")
    regions = tuple(_extract(root, region) for region in plan.regions)
    root.recompile()
    root.ckptplan_regions = regions
    root.ckptplan_leaves = leaves
    root.ckptplan_model = type(model).__name__
    root.ckptplan_plan = (
        f"Plan: solver {plan.solver}, budget {format_bytes(int(plan.budget.bytes))}, predicted "
        f"peak {format_bytes(int(plan.predicted.peak_bytes))}"
    )
    return root


def _identifier(path: str) -> str:
    return re.sub(r"\W", "_", path)


def _region_name(modules: tuple[str, ...]) -> str:
    first = _identifier(modules[0])
    if len(modules) == 1:
        return f"ckpt_{first}"
    last = _identifier(modules[-1].rpartition(".")[2])
    return f"ckpt_{first}_to_{last}"


def _class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_") if part)


def _argument(base: str) -> str:
    """The name a top-level attribute goes by as an argument: a Sequential's child ``0`` is no
    Python identifier."""
    return base if base.isidentifier() else f"module_{base}"


def _inside(node: Node, modules: tuple[str, ...]) -> bool:
    stack = node.meta.get("nn_module_stack") or {}
    return any(p == m or p.startswith(m + ".") for p in stack for m in modules)


def _region_nodes(graph: torch.fx.Graph, modules: tuple[str, ...]) -> list[Node]:
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


def _extract(root: torch.fx.GraphModule, region: Region) -> RegionInfo:
    """Move ``region``'s code out of the traced forward into a checkpointed submodule.

    Nested regions go first, so that the region takes their checkpoint calls with the rest
    of its code; every region is cut from the model's own graph.
    """
    nested = tuple(_extract(root, child) for child in region.children)
    name = _region_name(region.modules)
    label = "+".join(region.modules)
    saves = _saves(region.policy, label)
    graph = root.graph
    nodes = _region_nodes(graph, region.modules)
    chosen = set(nodes)
    inputs: list[Node] = []
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
            f"cannot run as one checkpoint; re-solve with {option('max_segment', 1)}"
        )
    body, bases = _body(root, nodes, inputs, outputs, {r.name for r in nested})
    sub = torch.fx.GraphModule(
        {r.name: root.get_submodule(r.name) for r in nested}, body, _class_name(name)
    )
    for r in nested:
        delattr(root, r.name)
    root.add_submodule(name, sub)
    stack = next(n.meta["nn_module_stack"] for n in nodes if _inside(n, region.modules))
    with graph.inserting_before(list(graph.nodes)[start]):
        state = [graph.create_node("get_attr", b, name=_argument(b)) for b in bases]
        target = graph.get_attr(name)
        kwargs: dict[str, Any] = {"use_reentrant": False, "preserve_rng_state": True}
        if saves is not None:
            calls = tuple((call.op, call.index) for call in saves)
            kwargs["context_fn"] = graph.create_node(
                "call_function", selective, (calls,), name=f"{name}_policy"
            )
        arguments = (target, *state, *inputs)
        call = graph.create_node("call_function", checkpoint, arguments, kwargs, name=f"{name}_out")
        results = (
            [call]
            if len(outputs) == 1
            else [graph.call_function(operator.getitem, (call, k)) for k in range(len(outputs))]
        )
    for new in (*state, target, *kwargs.values(), call, *results):
        if isinstance(new, Node):
            new.meta["nn_module_stack"] = dict(stack)
    for old, new in zip(outputs, results, strict=True):
        old.replace_all_uses_with(new, delete_user_cb=lambda user: user not in chosen)
    for node in reversed(nodes):
        graph.erase_node(node)
    info = RegionInfo(name, region.modules, saves, nested)
    sub.ckptplan_region = info
    return info


def _saves(policy: Policy | None, region: str) -> tuple[OpCall, ...] | None:
    """The op calls a region's policy keeps; the rewritten code cannot offload."""
    if policy is None:
        return None
    if policy.offloads:
        raise CkptplanError(
            f"policy of {region} offloads ops, which `ckptplan rewrite` does not do; apply the "
            "plan with ckptplan.apply(model, plan) instead"
        )
    return policy.saves


def _body(
    root: torch.nn.Module,
    nodes: list[Node],
    inputs: list[Node],
    outputs: list[Node],
    regions: set[str],
) -> tuple[torch.fx.Graph, list[str]]:
    """The region's code as a graph of its own, and the top-level attributes of the model it
    takes before its inputs: a module path ``blocks.1.attn.c_attn`` is reached from the
    ``blocks`` argument, so the region holds nothing but its nested ``regions``. Norms with
    running statistics run through ``norm_once``: recomputing the region in backward would
    update them a second time."""
    state = [n for n in nodes if n.op in ("call_module", "get_attr") and n.target not in regions]
    bases = list(dict.fromkeys(str(n.target).split(".")[0] for n in state))
    body = torch.fx.Graph()
    reached = {base: body.placeholder(_argument(base)) for base in bases}
    env = {i: body.placeholder(i.name) for i in inputs}
    for node in nodes:
        path = str(node.target)
        if node not in state:
            env[node] = body.node_copy(node, env.__getitem__)
        elif node.op == "get_attr":
            env[node] = _reach(body, reached, path)
        else:
            args = map_arg(node.args, env.__getitem__)
            kwargs = map_arg(node.kwargs, env.__getitem__)
            parent, _, method = path.rpartition(".")
            owner = _reach(body, reached, parent) if parent else None
            if isinstance(root.get_submodule(path), _NormBase):
                norm = (
                    reached[path]
                    if owner is None
                    else body.create_node(
                        "call_function",
                        getattr,
                        (owner, method),
                        name=f"{_identifier(path)}_module",
                    )
                )
                op, target, args = "call_function", norm_once, (norm, *args)
            elif owner is not None:
                op, target, args = "call_method", method, (owner, *args)
            else:
                op, target, args = "call_method", "__call__", (reached[path], *args)
            env[node] = body.create_node(op, target, args, kwargs, name=node.name)
            env[node].meta = dict(node.meta)
    body.output(env[outputs[0]] if len(outputs) == 1 else tuple(env[o] for o in outputs))
    return body, bases


def _reach(body: torch.fx.Graph, reached: dict[str, Node], path: str) -> Node:
    """The node of ``path`` in ``body``: attribute reads from the top-level argument."""
    if path not in reached:
        parent, _, name = path.rpartition(".")
        reached[path] = body.create_node(
            "call_function", getattr, (_reach(body, reached, parent), name), name=_identifier(path)
        )
    return reached[path]


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
    name = str(model_file)
    workload = HubModel.parse(name) if is_hub_name(name) else load_model_file(model_file)
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


class _CallableModule(types.ModuleType):
    """Lets ``ckptplan.rewrite(model, plan)`` work though ``ckptplan.rewrite`` is this module."""

    def __call__(
        self, model: torch.nn.Module, plan: Plan | str | Path, force: bool = False
    ) -> torch.fx.GraphModule:
        return rewrite(model, plan, force)


sys.modules[__name__].__class__ = _CallableModule
