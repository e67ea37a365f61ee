"""Trace a model with torch.fx into one graph that is right in ``train()`` and in ``eval()``,
over the model's own module tree.

Why two traces: fx records Python values as constants, and ``self.training`` is a Python
value, so ``F.dropout(x, p, self.training)`` or ``p if self.training else 0.0`` would keep the
training-mode value in eval(). Keeping every module that reads the flag a leaf (called as
itself) would be right, but those are the user's classes, which a written file cannot
rebuild. So the forward is traced in train() and in eval() and the graphs are compared node
by node: where only the constants differ, the node takes
``if_training(<its module>.training, train value, eval value)``, so it reads the flag at run
time as the original code did; where the code takes another path (``if self.training:``),
the module whose forward branched is kept a leaf, called as itself, and the model traced
again. torch.nn modules (dropout, batch norm) are leaves already and read their own flags.
A model whose own forward branches on its mode is refused.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch.fx.node import Node, map_arg

from ckptplan.errors import CkptplanError
from ckptplan.rewriting.runtime import if_training


def trace(model: torch.nn.Module) -> torch.fx.GraphModule:
    """``model``'s forward as a GraphModule that holds the model's own children, parameters
    and buffers, shared, at their paths (fx would copy only what the code uses, into new
    containers), so its state_dict is the model's. The tensor constants the tracer made are
    buffers outside the state_dict.
    """
    graph, constants = _graph(model)
    root = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph(), type(model).__name__)
    for name, child in model._modules.items():
        root.add_module(name, child)
    for name, parameter in model._parameters.items():
        root.register_parameter(name, parameter)
    for name, buffer in model._buffers.items():
        persistent = name not in model._non_persistent_buffers_set
        root.register_buffer(name, buffer, persistent=persistent)
    for name, constant in constants.items():
        root.register_buffer(name, constant, persistent=False)
    root.training = model.training
    root.graph = graph
    return root


class _Tracer(torch.fx.Tracer):
    """fx's tracer, which also keeps the classes in ``leaves`` as modules the code calls."""

    def __init__(self, leaves: frozenset[type]) -> None:
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return type(m) in self.leaves or super().is_leaf_module(m, module_qualified_name)


def _graph(model: torch.nn.Module) -> tuple[torch.fx.Graph, dict[str, torch.Tensor]]:
    """One graph of the forward, right in train() and in eval(), and the tensor constants it
    reads: traced in both modes until the two take the same code path."""
    leaves: frozenset[type] = frozenset()
    while True:
        graph, constants = _traced(model, True, leaves)
        parted = _merge(graph, _traced(model, False, leaves)[0])
        if parted is None:
            return graph, constants
        cls = type(model.get_submodule(parted))
        if not parted or cls in leaves:
            raise CkptplanError(
                f"{cls.__name__}.forward takes another path in eval() than in train(), so no "
                "one traced graph runs both; checkpoint the model in place with "
                "ckptplan.apply(model, plan) instead"
            )
        leaves |= {cls}


def _traced(
    model: torch.nn.Module, training: bool, leaves: frozenset[type]
) -> tuple[torch.fx.Graph, dict[str, torch.Tensor]]:
    """The forward traced in one mode, leaving the model as it was: every module's mode, and
    no tensor constants the tracer stores on the model (returned instead)."""
    modes = [(m, m.training) for m in model.modules()]
    attributes = set(vars(model))
    model.train(training)
    try:
        graph = _Tracer(leaves).trace(model)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CkptplanError(
            f"{type(model).__name__} does not trace with torch.fx ({type(exc).__name__}: "
            f"{first}); checkpoint it in place with ckptplan.apply(model, plan) instead"
        ) from None
    finally:
        for module, mode in modes:
            module.training = mode
        added = sorted(set(vars(model)) - attributes)
        constants = {name: vars(model).pop(name) for name in added}
    return graph, constants


def _merge(graph: torch.fx.Graph, other: torch.fx.Graph) -> str | None:
    """Make ``graph`` (traced in train()) right in eval() too, given ``other`` (traced in
    eval()): a node whose arguments differ takes ``if_training(<its module>.training, ours,
    theirs)`` instead. Returns the path of the module whose code takes another path in eval()
    ("" for the model's own forward), or None when the two graphs are one.
    """
    ours, theirs = list(graph.nodes), list(other.nodes)
    env: dict[Node, Node] = {}
    for k in range(max(len(ours), len(theirs))):
        a = ours[k] if k < len(ours) else None
        b = theirs[k] if k < len(theirs) else None
        if (
            a is None
            or b is None
            or (a.op, a.target, len(a.args), a.kwargs.keys())
            != (b.op, b.target, len(b.args), b.kwargs.keys())
        ):
            return max(_owner(a), _owner(b), key=lambda path: path.count(".") + bool(path))
        env[b] = a
        a.args = tuple(
            x if _same(x, y, env) else _choice(graph, a, f"{a.name}_arg{i}", x, y, env)
            for i, (x, y) in enumerate(zip(a.args, b.args, strict=True))
        )
        a.kwargs = {
            key: x
            if _same(x, b.kwargs[key], env)
            else _choice(graph, a, key, x, b.kwargs[key], env)
            for key, x in a.kwargs.items()
        }
    return None


def _same(x: Any, y: Any, env: dict[Node, Node]) -> bool:
    """Whether two traced arguments are the same value (``env``: their nodes' counterparts)."""
    if isinstance(x, Node) or isinstance(y, Node):
        return isinstance(y, Node) and env.get(y) is x
    if isinstance(x, tuple | list):
        return (
            type(x) is type(y)
            and len(x) == len(y)
            and all(_same(i, j, env) for i, j in zip(x, y, strict=True))
        )
    if isinstance(x, dict):
        return (
            type(x) is type(y)
            and x.keys() == y.keys()
            and all(_same(v, y[key], env) for key, v in x.items())
        )
    if isinstance(x, slice):
        return isinstance(y, slice) and _same(
            (x.start, x.stop, x.step), (y.start, y.stop, y.step), env
        )
    return type(x) is type(y) and bool(x == y)


def _choice(
    graph: torch.fx.Graph, node: Node, name: str, ours: Any, theirs: Any, env: dict[Node, Node]
) -> Node:
    """``name = if_training(flag, ours, theirs)`` before ``node``, reading its module's flag
    (named for the argument: a node named ``if_training`` would hide the function)."""
    owner = _owner(node)
    with graph.inserting_before(node):
        flag = graph.get_attr(f"{owner}.training" if owner else "training")
        arguments = (flag, ours, map_arg(theirs, env.__getitem__))
        choice = graph.create_node("call_function", if_training, arguments, name=name)
    for made in (flag, choice):
        made.meta["nn_module_stack"] = dict(node.meta.get("nn_module_stack") or {})
    return choice


def _owner(node: Node | None) -> str:
    """The module whose forward made ``node``: the innermost on its stack (a module is
    called by its caller's forward)."""
    if node is None:
        return ""
    stack = node.meta.get("nn_module_stack") or {}
    paths = [p for p in stack if not (node.op == "call_module" and p == node.target)]
    return paths[-1] if paths else ""
