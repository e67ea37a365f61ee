"""Apply a plan to a model in place, with non-reentrant ``torch.utils.checkpoint``.

Every planned module keeps its path, parameters and ``state_dict`` keys; only its class is
swapped for a subclass of the same name whose ``__call__`` routes the call through its region
(``ckptplan.applying.region``). A region (one module, or a run of consecutive sibling blocks)
runs all its members inside one checkpoint from the first member's call, each member through
its original ``__call__``, so module hooks (FSDP2's all-gather and reshard, Hugging Face's, the
user's) run inside the region, again during recomputation, and once per forward. A module that
runs several times per forward is planned call by call: its calls are counted per forward of
the model and each goes to its own region, or runs unchecked (``ckptplan.applying.calls``).

Nothing on the checkpointed path mutates Python state while ``torch.compile`` traces it, so a
checkpointed model compiles once, without graph breaks; in eager mode each region counts its
recomputations, and the first backward logs how many regions were recomputed
(``ckptplan.applying.stats``), so a plan cannot be silently not applied.

Running order: ``apply`` first, then ``fully_shard``/``DistributedDataParallel``, then
``torch.compile``.

Example:
    >>> model = ckptplan.apply(model, "plan.json")   # doctest: +SKIP
    >>> print(model.ckptplan_applied)                 # doctest: +SKIP
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import torch

from ckptplan.applying.calls import CallRoute, StepStart
from ckptplan.applying.guards import BatchGuard, TargetGuard
from ckptplan.applying.layered_rnn import layer_by_layer
from ckptplan.applying.region import RegionRun
from ckptplan.applying.stats import AppliedPlan, RegionStats, Reporter, region_name
from ckptplan.errors import CkptplanError
from ckptplan.fingerprint import check_model_matches
from ckptplan.huggingface import checkpointing_disable, training_conventions
from ckptplan.values.plan import Plan, Region, as_plan
from ckptplan.values.unit_names import split_unit

log = logging.getLogger("ckptplan")


def _member_call(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    member = self.__dict__["_ckptplan_member"]
    target = member.next_call() if isinstance(member, CallRoute) else member
    if target is None:  # a call of a shared module that the plan leaves unchecked
        return type(self)._ckptplan_base.__call__(self, *args, **kwargs)
    region, index = target
    return region.call(index, args, kwargs)


def _member_reduce(self: torch.nn.Module, protocol: int) -> tuple[Any, ...]:
    """Pickle (and deepcopy) a member as its class's member variant, by the original class."""
    return (_new_member, (type(self)._ckptplan_base,), self.__dict__.copy())


def _new_member(base: type[torch.nn.Module]) -> torch.nn.Module:
    return object.__new__(_member_class(base))


_MEMBER_CLASSES: dict[type[torch.nn.Module], type[torch.nn.Module]] = {}


def _member_class(base: type[torch.nn.Module]) -> type[torch.nn.Module]:
    """``base`` with a region-routing ``__call__``; same name, so fingerprints are unchanged."""
    if base not in _MEMBER_CLASSES:
        _MEMBER_CLASSES[base] = type(
            base.__name__,
            (base,),
            {
                "__call__": _member_call,
                "__reduce_ex__": _member_reduce,
                "__module__": base.__module__,
                "__qualname__": base.__qualname__,
                "_ckptplan_base": base,
            },
        )
    return _MEMBER_CLASSES[base]


def refuse_wrapped(model: torch.nn.Module) -> None:
    """One-line errors for the orders that cannot work, with the order that does."""
    order = "ckptplan.apply(model, plan), then fully_shard/DDP, then torch.compile"
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise CkptplanError(f"apply the plan before wrapping the model in DDP: {order}")
    # torch.compile's wrapper, known by its class: torch's name for it is private
    # (torch._dynamo), and importing that would cost a training job torch's compiler.
    wrapper = type(model)
    if wrapper.__name__ == "OptimizedModule" and wrapper.__module__.startswith("torch."):
        raise CkptplanError(f"apply the plan before torch.compile: {order}")
    # Only a process that imported FSDP can have wrapped the model with it; importing it here
    # would cost a training job half a second.
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is not None:
        kinds = (fsdp.FSDPModule, fsdp.FullyShardedDataParallel)
        if any(isinstance(m, kinds) for m in model.modules()):
            raise CkptplanError(f"apply the plan before fully_shard (FSDP): {order}")
    for module in model.modules():
        disable = checkpointing_disable(module)
        if disable is not None:
            raise CkptplanError(
                "the model already has Hugging Face checkpointing on, so the plan would "
                f"checkpoint twice; call model.{disable}() before applying it"
            )


def _check_region(
    region: Region, modules: dict[str, torch.nn.Module], used: dict[str, set[int | None]]
) -> None:
    """Refuse a region that is not a run of siblings' calls, or a call planned twice (``used``:
    module path -> its calls in regions so far)."""
    if not region.modules:
        raise CkptplanError("the plan has a region with no modules; re-solve it")
    parents = {path.rpartition(".")[0] for path in region.modules}
    if len(parents) != 1:
        raise CkptplanError(
            f"region {region_name(region.units)} joins modules of different parents; a "
            "region is a run of sibling modules"
        )
    for path, unit in zip(region.modules, region.units, strict=True):
        if path not in modules:
            raise CkptplanError(f"the plan names module {path!r}, which this model lacks")
        if "_ckptplan_member" in modules[path].__dict__:
            raise CkptplanError(f"{path} is already checkpointed by ckptplan; apply a plan once")
        call = split_unit(unit)[1]
        calls = used.setdefault(path, set())
        if call in calls or (calls and (call is None) != (None in calls)):
            raise CkptplanError(f"{unit} is in two regions of the plan; re-solve it")
        calls.add(call)


class _Installer:
    """Builds the runtime regions of a plan and swaps the members' classes."""

    def __init__(self, model: torch.nn.Module, applied: AppliedPlan) -> None:
        self.modules = dict(model.named_modules())
        self.reporter = Reporter(applied)
        self.stats: list[RegionStats] = []
        self.nested_stats: list[RegionStats] = []
        self.nested: list[tuple[str, ...]] = []
        self.used: dict[str, set[int | None]] = {}
        self.installs: list[tuple[RegionRun, int, int | None]] = []
        self.routes: dict[int, CallRoute] = {}
        """Shared modules' routes, by module identity."""

    def region(self, region: Region, top: bool, swap: bool) -> RegionRun:
        if swap:
            _check_region(region, self.modules, self.used)
        members = [self.modules[p] for p in region.modules]
        stats = RegionStats(region_name(region.units))
        (self.stats if top else self.nested_stats).append(stats)
        run = RegionRun(
            members,
            region.units,
            [type(m) for m in members],
            region.policy,
            stats,
            self.reporter if top else None,
        )
        if swap:
            calls = region.calls or (None,) * len(members)
            self.installs.extend((run, i, call) for i, call in enumerate(calls))
        for child in region.children:
            self.child(region, run, child)
        return run

    def child(self, parent: Region, run: RegionRun, child: Region) -> None:
        self.nested.append(child.units)
        names = region_name(child.units)
        count = len(child.units)
        for start in range(len(parent.units) - count + 1):
            if parent.units[start : start + count] == child.units:
                if count == len(parent.modules):
                    raise CkptplanError(f"nested region {names} is its parent region; re-solve")
                if any(
                    s[2] is not None and s[0] < start + count and start < s[1] for s in run.steps
                ):
                    raise CkptplanError(f"nested region {names} overlaps another; re-solve")
                run.nest(start, start + count, self.region(child, top=False, swap=False))
                return
        inside = all(any(p.startswith(m + ".") for m in parent.modules) for p in child.modules)
        if not inside:
            raise CkptplanError(
                f"nested region {names} is neither a run of {region_name(parent.units)} nor "
                "inside it; re-solve the plan"
            )
        run.enclose(self.region(child, top=False, swap=True))

    def install(self) -> None:
        """Route each planned member's calls to its region: a module's only call directly, the
        calls of a shared module through its ``CallRoute``."""
        for run, index, call in self.installs:
            module = run.modules[index]
            if call is None:
                module.__dict__["_ckptplan_member"] = (run, index)
            else:
                route = self.routes.setdefault(id(module), CallRoute())
                route.targets[call] = (run, index)
                module.__dict__["_ckptplan_member"] = route
            if "_ckptplan_base" not in type(module).__dict__:
                module.__class__ = _member_class(type(module))


def refuse_unapplicable(model: torch.nn.Module) -> None:
    """Refuse a model no plan can be applied to (checkpointed already, or wrapped by DDP, FSDP2
    or ``torch.compile``), before any plan is read or solved for it."""
    if getattr(model, "ckptplan_applied", None) is not None:
        raise CkptplanError(
            f"{type(model).__name__} is already checkpointed by ckptplan; apply a plan once"
        )
    refuse_wrapped(model)


def apply(
    model: torch.nn.Module, plan: Plan | str | Path, force: bool = False, stage: int | None = None
) -> torch.nn.Module:
    """Checkpoint ``model`` in place as ``plan`` says, and return it.

    Refuses a model that is already checkpointed by ckptplan (or by Hugging Face), a model
    already wrapped by DDP, FSDP2 or ``torch.compile`` (apply comes first), and a model whose
    structure differs from the one the plan was made for (unless ``force``). The summary of
    what was wrapped is logged and kept as ``model.ckptplan_applied``, whose counters show the
    recomputations. Training with it then warns of a batch larger than the plan's, and refuses
    Hugging Face checkpointing switched on inside its regions (``ckptplan.applying.guards``).

    With ``stage``, ``model`` is that pipeline stage's module and only its blocks are checked
    and checkpointed (``ckptplan.applying.pipeline_stage.stage_plan``).
    """
    plan = as_plan(plan)
    refuse_unapplicable(model)
    if stage is None:
        check_model_matches(model, plan, force)
    else:
        # Imported here: ckptplan.planning.pipeline solves through ckptplan.api, which imports this
        # module.
        from ckptplan.applying.pipeline_stage import stage_plan

        plan = stage_plan(model, plan, stage, force)
    layer_by_layer(model)  # as profiling did: a stacked LSTM's layers may be planned units
    for note in training_conventions(model)[1]:
        log.warning("ckptplan.apply: %s", note)
    applied = AppliedPlan(
        regions=tuple(r.units for r in plan.regions),
        solver=plan.solver,
        policies=tuple(r.policy for r in plan.regions),
    )
    installer = _Installer(model, applied)
    for region in plan.regions:
        installer.region(region, top=True, swap=True)
    installer.install()
    applied.stats = tuple(installer.stats)
    applied.nested_stats = tuple(installer.nested_stats)
    applied.nested = tuple(installer.nested)
    model.ckptplan_applied = applied
    model.register_forward_pre_hook(BatchGuard(plan.inputs), with_kwargs=True)
    model.register_forward_pre_hook(TargetGuard(plan.settings.device), with_kwargs=True)
    if installer.routes:
        model.register_forward_pre_hook(StepStart(list(installer.routes.values())))
    log.info("%s", applied)
    return model
