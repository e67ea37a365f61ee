"""Peer strategies measured like a plan, for the benchmarks and the sweep: any change to the
model (Hugging Face's checkpointing, a hand-written wrapper) and ``torch.compile``'s
``activation_memory_budget``."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from ckptplan.loading import Workload
from ckptplan.patching import patched_config
from ckptplan.values.plan import PlanSettings
from ckptplan.verifying.comparison import Comparison, compare
from ckptplan.verifying.localrun import baseline_run, run_device


class _Partitioned(torch.nn.Module):
    """``model`` traced by AOTAutograd, its backward split off by ``partition_fn``.

    Like ``aot_module``, but parameters and buffers go in once each, by their first names, so
    tied weights (a GPT's head and embedding) stay one tensor; ``functional_call`` ties them
    back. ``named_parameters`` are the model's own, so gradients compare name by name.
    """

    def __init__(self, model: torch.nn.Module, partition_fn: Any) -> None:
        from functorch.compile import aot_function, nop

        super().__init__()
        self.model = model
        self.params = dict(model.named_parameters())
        self.buffers_ = dict(model.named_buffers())

        def step(state: dict[str, torch.Tensor], *args: Any, **kwargs: Any) -> Any:
            return torch.func.functional_call(model, state, args, kwargs)

        self.compiled = aot_function(
            step, fw_compiler=nop, bw_compiler=nop, partition_fn=partition_fn
        )

    def named_parameters(self, *args: Any, **kwargs: Any) -> Any:
        yield from self.model.named_parameters(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled({**self.params, **self.buffers_}, *args, **kwargs)


def measure_change(
    model_file: Workload,
    settings: PlanSettings,
    change: Callable[[torch.nn.Module], torch.nn.Module],
    device: str | None = None,
    repeats: int = 3,
) -> Comparison:
    """A peer strategy measured like a plan: ``change`` turns a copy of the model into the
    candidate (Hugging Face's ``gradient_checkpointing_enable``, a hand-written wrapper), and
    the candidate's peak, time and gradients are compared with the unchanged model's."""
    target = run_device(device)
    baseline_model, inputs, _ = baseline_run(model_file, settings, target)
    candidate = change(copy.deepcopy(baseline_model))
    return compare(model_file, settings, baseline_model, candidate, inputs, target, repeats)


def measure_compile_budget(
    model_file: Workload,
    settings: PlanSettings,
    memory_budget: float,
    device: str | None = None,
    repeats: int = 3,
) -> Comparison:
    """``torch.compile``'s ``activation_memory_budget`` peer, measured like a plan.

    AOTAutograd's min-cut partitioner chooses what to recompute under the budget; it runs here
    through ``aot_function`` with eager (nop) compilers, the partitioning ``torch.compile``
    applies, without dynamo, so the live-storage tracker can count the compiled step. The
    partitioner reads the budget from functorch's config only, a process-wide setting, so it is
    set under ``patching``'s lock (Note [process-wide patches]).
    """
    from functorch.compile import min_cut_rematerialization_partition
    from torch._functorch import config as functorch_config

    target = run_device(device)
    baseline_model, inputs, _ = baseline_run(model_file, settings, target)
    with patched_config(functorch_config, activation_memory_budget=memory_budget):
        candidate = _Partitioned(copy.deepcopy(baseline_model), min_cut_rematerialization_partition)
        return compare(model_file, settings, baseline_model, candidate, inputs, target, repeats)
