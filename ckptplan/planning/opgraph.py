"""A profiled training step as an op-level rematerialization problem, and how far a chain plan
is from that problem's optimum.

``to_remat_problem`` turns the forward and backward ops of a ``Profile`` into a
``ckptplan.solvers.remat.RematProblem``: one node per aten op, an edge wherever an op reads a
storage another op wrote (``OpRecord.inputs``), ``mem`` the bytes the op brings into being and
``cost`` its time in integer units (nanoseconds by default, at least 1). What the graph covers:

- every op of the forward (before, inside and after the blocks: embedding, head, loss) and of
  the backward, in the order the unchecked step ran them;
- not the optimizer step: it runs after backward whatever the plan, its in-place updates of
  parameters and moments are outside the one-output-per-op model, and its transient is a fixed
  event (``Chain.fixed_peaks``), not something a plan moves.

So the memory it counts is what ``scope="activations"`` budgets: op outputs only, never
parameters, optimizer state or the batch. A backward op whose output no op of the graph reads
makes a gradient for ``AccumulateGrad`` (a parameter's, or the batch's); the activations scope
takes those out of every figure, and so does the graph: such nodes have size 0 (with
``count_gradients`` each is counted at the one step that makes it).

Known differences from the live-storage timeline (they apply to the auto plan and the ILP alike):
an op with several outputs holds them all as long as any is read (``native_layer_norm``'s mean
and rstd with its output); an in-place op is a new value of its storage's bytes, so at the one
step it runs the old and the new version are both counted; a view or alias costs nothing and its
readers read the op that wrote the storage.

``schedule_of_plan`` writes a chain plan (segments of blocks, selective options) as a schedule
of that problem, the way non-reentrant ``torch.utils.checkpoint`` runs it (docs/design.md §5),
and ``optimality_gap`` compares its cost with ``solvers.remat.solve`` at the same peak.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ckptplan.planning.problem import block_forward_ops, op_names, selective_menus
from ckptplan.planning.schedule_plan import region_policy
from ckptplan.solvers.chain import Chain, Schedule, validate_segments
from ckptplan.solvers.remat import RematNode, RematProblem, solve
from ckptplan.solvers.remat_check import check_schedule
from ckptplan.solvers.selective import Selection
from ckptplan.values.phase import Direction, Phase
from ckptplan.values.plan import Plan
from ckptplan.values.policy_types import Policy
from ckptplan.values.profile_types import Profile

TIME_UNIT = 1e-9
"""Seconds per unit of node cost: integer nanoseconds."""


@dataclass(frozen=True)
class OpGraph:
    """A ``RematProblem`` over a step's ops, and which op record each node stands for.

    Op nodes have ids ``0 .. n_ops - 1`` in execution order. With ``fix_order`` every op lies on
    a longer path from the sources than the op before it: where the data edges do not already
    say so, a link node (cost 0, size 0, ids from ``n_ops`` on) reads op ``i - 1`` and is read by
    op ``i``. So every schedule computes the ops first in the order PyTorch ran them (the order a
    checkpoint plan keeps), and the ILP's order ``T`` (networkx generations, which would hoist,
    say, ``arange`` to the start) is the execution order, so its proofs cover the translated
    plans. A link runs right after the op it reads, so it adds no memory.
    """

    problem: RematProblem
    records: tuple[int, ...]
    """Op node id -> index of its record in ``Profile.ops``."""
    phases: tuple[str, ...]
    """Op node id -> phase of the step (``fwd:3``, ``bwd:post``, ...); an autograd op that
    ran inside a forward phase is ``bwd:?``, so it never counts as a block's forward."""
    blocks: tuple[int | None, ...]
    """Op node id -> block whose forward or backward it belongs to (None outside the blocks)."""
    links: dict[int, int]
    """Op node id -> the link node that orders it after the op before it (where one is needed)."""
    time_unit: float = TIME_UNIT

    @property
    def n_ops(self) -> int:
        return len(self.records)

    @property
    def total_cost(self) -> int:
        """Cost of running every op once: a schedule's cost above it is recomputation."""
        return self.problem.total_cost

    def forward_ops(self, block: int) -> list[int]:
        """Op nodes of ``block``'s forward, in order: what its checkpoint recomputes."""
        phase = Phase.forward(block).label
        return [v for v, p in enumerate(self.phases) if p == phase]

    def backward_ops(self, block: int) -> list[int]:
        phase = Phase.backward(block).label
        return [v for v, p in enumerate(self.phases) if p == phase]


def _in_graph(label: str) -> bool:
    return Phase.parse(label).direction is not None


def _graph_phase(label: str, backward: bool) -> Phase:
    """An op's phase in the graph: an autograd op that ran inside a forward phase is no
    block's own."""
    phase = Phase.parse(label)
    return Phase.unattributed(Direction.BACKWARD) if backward and phase.is_forward else phase


def to_remat_problem(
    profile: Profile,
    *,
    time_unit: float = TIME_UNIT,
    fix_order: bool = True,
    count_gradients: bool = False,
) -> OpGraph:
    """The op graph of ``profile``'s forward and backward (see the module docstring)."""
    chosen = [i for i, op in enumerate(profile.ops) if _in_graph(op.phase)]
    if not chosen:
        raise ValueError(f"the profile of {profile.model_name} records no forward/backward ops")
    if len(chosen) > 1 and not any(profile.ops[i].inputs for i in chosen):
        raise ValueError("the profile's ops carry no inputs: profile it again with this version")
    node_of = {record: v for v, record in enumerate(chosen)}
    read = {source for record in chosen for source in profile.ops[record].inputs}
    nodes: list[RematNode] = []
    edges: dict[tuple[int, int], None] = {}
    for v, record in enumerate(chosen):
        op = profile.ops[record]
        gradient = not count_gradients and op.backward and record not in read
        nodes.append(
            RematNode(
                id=v,
                cost=max(1, round(op.time / time_unit)),
                mem=0 if gradient else op.allocated_bytes + op.overwritten_bytes,
                name=f"{op.op} [{op.phase}]",
            )
        )
        for source in op.inputs:
            if source in node_of:
                edges[(node_of[source], v)] = None
    links = _links(len(chosen), list(edges)) if fix_order else {}
    for v, link in links.items():
        nodes.append(RematNode(id=link, cost=0, mem=0, name=f"order {v - 1} -> {v}"))
        edges[(v - 1, link)] = None
        edges[(link, v)] = None
    phases = tuple(_graph_phase(profile.ops[r].phase, profile.ops[r].backward) for r in chosen)
    return OpGraph(
        problem=RematProblem(tuple(nodes), tuple(edges), name=profile.model_name),
        records=tuple(chosen),
        phases=tuple(p.label for p in phases),
        blocks=tuple(p.block_index for p in phases),
        links=links,
        time_unit=time_unit,
    )


def _links(n: int, edges: list[tuple[int, int]]) -> dict[int, int]:
    """Where op ``v`` needs a link after op ``v - 1`` so that the longest path from a source
    (networkx's generation) grows strictly along the execution order; link ids from ``n``."""
    preds: list[list[int]] = [[] for _ in range(n)]
    for u, v in edges:
        preds[v].append(u)
    depth = [0] * n
    links: dict[int, int] = {}
    for v in range(n):
        depth[v] = 1 + max((depth[u] for u in preds[v]), default=-1)
        if v and depth[v] <= depth[v - 1]:
            links[v] = n + len(links)
            depth[v] = depth[v - 1] + 2
    return links


def _op_names(graph: OpGraph, profile: Profile, forward: list[int]) -> dict[str, int]:
    """``aten.op.overload#k`` -> op node, ``k`` counting that overload's calls in the region's
    forward, as ``problem.save_items`` and the selective policy count them."""
    names = op_names([profile.ops[graph.records[v]] for v in forward])
    return dict(zip(names, forward, strict=True))


def _plan_regions(
    profile: Profile,
    plan: Plan | Schedule,
    menus: list[list[Selection]] | None,
) -> list[tuple[int, int, tuple[str, ...]]]:
    """(start block, end block, names of the ops kept) of every checkpointed region."""
    if isinstance(plan, Schedule):
        if plan.options and menus is None:
            menus = selective_menus(profile)
        chosen = {block: menus[block][option] for block, option in plan.options} if menus else {}
        forward = block_forward_ops(profile)
        return [
            (start, end, _kept(region_policy(forward, start, end, chosen)))
            for start, end in plan.segments
        ]
    paths = [b.path for b in profile.blocks]
    if list(plan.blocks) != paths:
        raise ValueError("the plan was made for other blocks than the profile's")
    regions = []
    for region in plan.regions:
        if region.children:
            raise ValueError("nested regions are not translated to the op graph")
        start = paths.index(region.units[0])
        end = start + len(region.units)
        if tuple(paths[start:end]) != region.units:
            raise ValueError(f"region {region.units} is not a run of consecutive blocks")
        regions.append((start, end, _kept(region.policy)))
    return regions


def _kept(policy: Policy | None) -> tuple[str, ...]:
    """The op calls a region's policy keeps, named as ``_op_names`` names the graph's ops."""
    if policy is not None and policy.offloads:
        raise ValueError("the op graph does not model offload to host memory")
    return () if policy is None else tuple(map(str, policy.saves))


def schedule_of_plan(
    graph: OpGraph,
    profile: Profile,
    plan: Plan | Schedule,
    *,
    menus: list[list[Selection]] | None = None,
    early_stop: bool = True,
) -> list[int]:
    """The schedule (node ids, repeats are recomputations) of a chain plan, as PyTorch runs it.

    Forward runs every op once, in order. A checkpointed region recomputes when its backward
    starts (at the first op of its last block's backward, where autograd first unpacks a
    tensor the region saved): its forward ops again, in order, except the ops its selective
    policy keeps (their cached outputs are reused); with ``early_stop`` (torch's default) the
    re-run stops after the last op whose output the region's backward reads. Then the backward
    ops run. ``menus`` name the ops of a ``Schedule``'s options (default: ``selective_menus``).
    """
    recompute_at: dict[int, list[int]] = {}
    for start, end, saved in _plan_regions(profile, plan, menus):
        forward = [v for block in range(start, end) for v in graph.forward_ops(block)]
        backward = [v for block in range(start, end) for v in graph.backward_ops(block)]
        names = _op_names(graph, profile, forward)
        missing = [name for name in saved if name not in names]
        if missing:
            raise ValueError(f"blocks [{start}, {end}) have no forward op named {missing[0]}")
        kept = {names[name] for name in saved}
        if not backward:
            continue
        if early_stop:
            later, earlier = set(backward), set(forward)
            read = {u for u, v in graph.problem.edges if v in later and u in earlier}
            last = max((i for i, v in enumerate(forward) if v in read), default=-1)
            forward = forward[: last + 1]
        recompute_at[min(backward)] = [v for v in forward if v not in kept]
    order: list[int] = []
    for v in range(graph.n_ops):
        order.extend(recompute_at.get(v, ()))
        order.append(v)
        link = graph.links.get(v + 1)
        if link is not None:
            order.append(link)
    return order


@dataclass(frozen=True)
class GapReport:
    """A chain plan against the op-level optimum at the plan's own peak.

    Costs are in the graph's time units; ``gap = (auto_cost - ilp_cost) / ilp_cost`` (negative
    where the ILP stopped on a worse schedule), ``recompute_gap`` the same difference over the
    ILP's recompute (None when the ILP recomputes nothing), ``bound_gap`` the difference over
    the ILP's lower bound, which holds whether or not the ILP proved optimality (for the class
    of schedules ``ilp_reason`` names: all of them, or the stage model's).
    """

    model: str
    n_ops: int
    n_nodes: int
    n_edges: int
    segments: tuple[tuple[int, int], ...]
    options: tuple[tuple[int, int], ...]
    total_cost: int
    budget: int
    auto_cost: int
    auto_peak: int
    chain_peak: int
    chain_recompute_s: float
    ilp_status: str
    ilp_cost: int | None
    ilp_peak: int | None
    ilp_lower_bound: int
    ilp_reason: str
    ilp_seconds: float
    gap: float | None
    recompute_gap: float | None
    bound_gap: float | None
    time_unit: float = TIME_UNIT

    @property
    def auto_recompute(self) -> int:
        return self.auto_cost - self.total_cost

    @property
    def ilp_recompute(self) -> int | None:
        return None if self.ilp_cost is None else self.ilp_cost - self.total_cost

    @property
    def auto_recompute_s(self) -> float:
        """Seconds the plan spends recomputing, by the op graph (early stop included)."""
        return self.auto_recompute * self.time_unit

    @property
    def proven(self) -> bool:
        return self.ilp_status == "optimal"

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["auto_recompute"] = self.auto_recompute
        data["ilp_recompute"] = self.ilp_recompute
        data["auto_recompute_s"] = self.auto_recompute_s
        return data


def _ratio(a: int, b: int) -> float | None:
    return None if b <= 0 else a / b


def optimality_gap(
    profile: Profile,
    chain: Chain,
    schedule: Schedule,
    time_limit_s: float = 60.0,
    *,
    menus: list[list[Selection]] | None = None,
    graph: OpGraph | None = None,
    early_stop: bool = True,
    workers: int = 2,
) -> GapReport:
    """How much more the chain ``schedule`` (``chain``'s plan, e.g. from ``auto``) costs than
    the exact op-graph solver at the same peak memory.

    The plan's schedule is checked and measured by ``solvers.remat_check.check_schedule``; the
    ILP (``solvers.remat.solve``) gets that peak as its budget, and its schedule is checked the
    same way before it is reported.
    """
    if len(chain.blocks) != len(profile.blocks):
        raise ValueError("the chain was not built from this profile")
    validate_segments(chain, schedule.segments)
    graph = graph or to_remat_problem(profile)
    order = schedule_of_plan(graph, profile, schedule, menus=menus, early_stop=early_stop)
    ceiling = sum(node.mem for node in graph.problem.nodes)  # no schedule holds more
    cost, peak = check_schedule(graph.problem, order, budget=ceiling)
    result = solve(graph.problem, budget=peak, time_limit_s=time_limit_s, workers=workers)
    ilp_cost = ilp_peak = None
    if result.order:
        ilp_cost, ilp_peak = check_schedule(graph.problem, result.order, budget=peak)
    total = graph.total_cost
    gap = recompute_gap = None
    if ilp_cost is not None:
        gap = _ratio(cost - ilp_cost, ilp_cost)
        recompute_gap = _ratio(cost - ilp_cost, ilp_cost - total)
        if recompute_gap is None and cost == ilp_cost:
            recompute_gap = 0.0
    return GapReport(
        model=profile.model_name,
        n_ops=graph.n_ops,
        n_nodes=len(graph.problem.nodes),
        n_edges=len(graph.problem.edges),
        segments=tuple(schedule.segments),
        options=tuple(schedule.options),
        total_cost=total,
        budget=peak,
        auto_cost=cost,
        auto_peak=peak,
        chain_peak=schedule.peak,
        chain_recompute_s=schedule.recompute_time,
        ilp_status=result.status.value,
        ilp_cost=ilp_cost,
        ilp_peak=ilp_peak,
        ilp_lower_bound=result.lower_bound,
        ilp_reason=result.reason,
        ilp_seconds=result.solve_seconds,
        gap=gap,
        recompute_gap=recompute_gap,
        bound_gap=_ratio(cost - result.lower_bound, result.lower_bound),
        time_unit=graph.time_unit,
    )
