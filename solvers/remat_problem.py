"""A rematerialization instance (torch-free): a DAG of ops with costs and output sizes, read
from the Checkmate instances' node-link JSON; the problem ``ckptplan.solvers.remat.solve``
takes (see its module for the schedule and how it is solved).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

__all__ = ["RematNode", "RematProblem", "load_instance", "topological_order"]


@dataclass(frozen=True)
class RematNode:
    """One op: ``cost`` to compute it once, ``mem`` bytes for its single output."""

    id: int
    cost: int
    mem: int
    name: str = ""


@dataclass(frozen=True)
class RematProblem:
    """A DAG of ops; an edge ``(u, v)`` means ``v`` reads the output of ``u``."""

    nodes: tuple[RematNode, ...]
    edges: tuple[tuple[int, int], ...]
    name: str = ""

    def __post_init__(self) -> None:
        ids = [node.id for node in self.nodes]
        if len(set(ids)) != len(ids):
            raise ValueError("node ids are not unique")
        for node in self.nodes:
            if node.cost < 0 or node.mem < 0:
                raise ValueError(f"node {node.id} has a negative cost or size")
        known = set(ids)
        for u, v in self.edges:
            if u not in known or v not in known:
                raise ValueError(f"edge ({u}, {v}) names an unknown node")
            if u == v:
                raise ValueError(f"edge ({u}, {v}) is a self-loop")
        if not nx.is_directed_acyclic_graph(self.graph()):
            raise ValueError("the graph has a cycle")

    def graph(self) -> nx.DiGraph:
        """The networkx view, nodes and edges inserted in the problem's order."""
        g = nx.DiGraph()
        g.add_nodes_from(node.id for node in self.nodes)
        g.add_edges_from(self.edges)
        return g

    @property
    def total_cost(self) -> int:
        """Cost of computing every node exactly once: the baseline of the overhead."""
        return sum(node.cost for node in self.nodes)


def load_instance(path: str | Path) -> RematProblem:
    """Read a node-link JSON instance (Checkmate or random-layered spelling).

    Node costs come from ``cost_cpu`` or ``duration``, sizes from ``cost_ram`` or ``out_cost``;
    links are keyed ``source``/``target`` or ``"0"``/``"1"``. Raises ``ValueError`` (naming the
    problem) on malformed content and ``OSError`` when the file cannot be read.
    """
    text = Path(path).read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise ValueError(f"{path} has no 'nodes' list (expected networkx node-link JSON)")
    links = data.get("links", data.get("edges"))
    if not isinstance(links, list):
        raise ValueError(f"{path} has no 'links' list (expected networkx node-link JSON)")
    nodes = [_read_node(raw, i) for i, raw in enumerate(data["nodes"])]
    edges = [_read_link(raw, i) for i, raw in enumerate(links)]
    graph = data.get("graph")
    name = str(graph.get("name", "")) if isinstance(graph, dict) else ""
    return RematProblem(nodes=tuple(nodes), edges=tuple(edges), name=name or Path(path).stem)


def _field(raw: dict, names: Sequence[str], what: str) -> int:
    for name in names:
        if name in raw:
            value = raw[name]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{what}: {name!r} is not a number")
            if value != int(value):
                raise ValueError(f"{what}: {name!r} is not an integer")
            return int(value)
    raise ValueError(f"{what} has none of {', '.join(repr(n) for n in names)}")


def _read_node(raw: object, i: int) -> RematNode:
    if not isinstance(raw, dict):
        raise ValueError(f"node #{i} is not an object")
    what = f"node #{i}"
    return RematNode(
        id=_field(raw, ["id"], what),
        cost=_field(raw, ["cost_cpu", "duration"], what),
        mem=_field(raw, ["cost_ram", "out_cost"], what),
        name=str(raw.get("name", "")),
    )


def _read_link(raw: object, i: int) -> tuple[int, int]:
    if not isinstance(raw, dict):
        raise ValueError(f"link #{i} is not an object")
    what = f"link #{i}"
    return _field(raw, ["source", "0"], what), _field(raw, ["target", "1"], what)


def topological_order(problem: RematProblem) -> list[int]:
    """``networkx.topological_sort`` of the problem's graph: the order ``T`` budgets refer to."""
    return list(nx.topological_sort(problem.graph()))
