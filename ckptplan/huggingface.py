"""Hugging Face's conventions, in one place: how ckptplan knows a transformers model, the model
spec that names one, the batch and output it takes, its own checkpointing, the ``kernels`` hub's
routing, and what the library logs or asks of tensor values.

Every stage meets some of them (loading builds an ``hf:`` model, profiling answers its mask
question, the runtime refuses its checkpointing inside a region), and transformers changes them
between releases (``gradient_checkpointing_enable`` became ``activation_checkpointing_enable``),
so they are kept here, where a new release is checked against one file; the behaviour built on
them stays with its stage (``tests/test_huggingface.py`` checks the names against the
installed transformers). This module imports only the standard library (torch only inside
``output_loss``, whose callers hold a model's output), so the runtime, the CLI's torch-free
entry (its ``--task`` choices) and every stage may import it; transformers is never imported
here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

HUB_PREFIX = "hf:"
"""A model spec that names a Hugging Face config instead of a model file: ``hf:NAME_OR_DIR``."""
CONFIG_FILE = "config.json"
"""The one file an ``hf:`` model is built from (``from_config``: no weights are read)."""
AUTO_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
    "sequence-classification": "AutoModelForSequenceClassification",
    "image-classification": "AutoModelForImageClassification",
}
"""Task (``--task``) -> the transformers auto class that builds it."""
HUB_TASKS = tuple(AUTO_CLASSES)
"""The tasks an ``hf:`` model can be built for."""
_ARCHITECTURE_TASKS = {
    "ForCausalLM": "causal-lm",
    "LMHeadModel": "causal-lm",
    "ForMaskedLM": "masked-lm",
    "ForConditionalGeneration": "seq2seq-lm",
    "ForSequenceClassification": "sequence-classification",
    "ForImageClassification": "image-classification",
}
"""Suffix of an architecture's class name -> the task its head trains for."""

INPUT_IDS = "input_ids"
"""A text model's batch: token ids, ``(batch, seq_len)``."""
PIXEL_VALUES = "pixel_values"
"""An image model's batch: ``(batch, channels, side, side)``."""
LABELS = "labels"
"""The batch's targets: a model given them computes its own loss (``output_loss``)."""

LAYERDROP = ("layerdrop", "encoder_layerdrop", "decoder_layerdrop")
"""Where a model keeps its LayerDrop probability: on its config (wav2vec 2.0), or copied onto
the module (BART's ``self.layerdrop``)."""

CHECKPOINTING_SWITCHES = (
    "model.activation_checkpointing_enable(), or TrainingArguments(activation_checkpointing=True)"
)
"""How a user switches Hugging Face's own checkpointing on (for the messages that refuse it)."""

MASKING_MODULE = "transformers.masking_utils"
"""The module whose global ``PACKED_SEQUENCES`` the library's mask code calls."""
PACKED_SEQUENCES = "find_packed_sequence_indices"
"""transformers' question whether position ids pack several sequences into one row, which reads
tensor values (``profiling.fakepaths`` answers it on fake tensors)."""

LOG_NOISE = {
    "transformers.modeling_utils": re.compile(r"`loss_type=\w+` was set in the config but it is"),
}
"""Library logger -> its messages that are no user's business during ckptplan's own runs: the
"`loss_type=None` ... unrecognized" said of a profiled model class it names no loss for, whose
own default loss ckptplan runs (``quietlogs``)."""


def is_hub_name(model: object) -> bool:
    """Whether ``model`` is an ``hf:`` spec; a path object is always a model file.

    >>> is_hub_name("hf:gpt2"), is_hub_name("model.py")
    (True, False)
    """
    return isinstance(model, str) and model.startswith(HUB_PREFIX)


def architecture_task(architecture: str) -> str | None:
    """The task an architecture's class name says by its suffix; None when it says none.

    >>> architecture_task("LlamaForCausalLM"), architecture_task("GPT2LMHeadModel")
    ('causal-lm', 'causal-lm')
    >>> architecture_task("BertModel") is None
    True
    """
    return next(
        (task for suffix, task in _ARCHITECTURE_TASKS.items() if architecture.endswith(suffix)),
        None,
    )


def output_loss(output: object) -> torch.Tensor | None:
    """The loss the model computed itself (a ``ModelOutput``'s ``loss``, there when the batch
    held labels); None when the output carries none."""
    import torch  # here, not at the top: the module imports without torch (see above)

    loss = getattr(output, "loss", None)
    return loss if isinstance(loss, torch.Tensor) else None


def configs(model: torch.nn.Module) -> list[Any]:
    """The configs ``model``'s modules hold (``module.config``), each once: submodules share
    their model's, or hold their own (an encoder-decoder's halves)."""
    found = {id(c): c for m in model.modules() if (c := getattr(m, "config", None)) is not None}
    return list(found.values())


def training_conventions(model: torch.nn.Module, inputs: Any = None) -> tuple[Any, tuple[str, ...]]:
    """The model and batch set up as a training step runs them, and what was changed.

    Hugging Face decoders default to ``use_cache=True``: in training the key/value cache is
    wasted memory, and a recomputed block would append to it again (checkpoint then refuses
    the recomputed values' metadata). Hugging Face's own checkpointing turns it off, so does
    this, on every config in the model and in the batch's keyword arguments.
    """
    cached = [c for c in configs(model) if getattr(c, "use_cache", False) is True]
    for config in cached:
        config.use_cache = False
    asked = isinstance(inputs, dict) and inputs.get("use_cache") is True
    if asked:
        inputs = {**inputs, "use_cache": False}
    notes = ("the key/value cache (use_cache) is off, as in training",) if cached or asked else ()
    return inputs, notes


def gives_positions(inputs: object) -> bool:
    """Whether a batch of keyword arguments gives the model its position ids."""
    return isinstance(inputs, dict) and "position_ids" in inputs


def checkpointing_layers(members: Iterable[torch.nn.Module]) -> list[torch.nn.Module]:
    """The modules under ``members`` that Hugging Face's checkpointing can switch on: their
    class declares the ``gradient_checkpointing`` flag (``GradientCheckpointingLayer``)."""
    return [
        m
        for member in members
        for m in member.modules()
        if isinstance(getattr(type(m), "gradient_checkpointing", None), bool)
    ]


def checkpointing_on(layer: torch.nn.Module) -> bool:
    """Whether Hugging Face's checkpointing is switched on in one of ``checkpointing_layers``."""
    return bool(layer.gradient_checkpointing)


def checkpointing_disable(module: torch.nn.Module) -> str | None:
    """The method of ``module`` (a transformers model) that switches off the Hugging Face
    checkpointing it has on, or None when it is off: ``activation_checkpointing_disable``, or
    before that name existed ``gradient_checkpointing_disable``."""
    current = hasattr(type(module), "is_activation_checkpointing")
    flag = "is_activation_checkpointing" if current else "is_gradient_checkpointing"
    declared = hasattr(type(module), flag) or flag in vars(module)
    if declared and getattr(module, flag) is True:
        return f"{'activation' if current else 'gradient'}_checkpointing_disable"
    return None


def routes_hub_functions(module: torch.nn.Module) -> bool:
    """Whether the ``kernels`` package routes ``module``'s calls of hub functions: it holds
    its own copies of them (``_kernel_funcs``) and its class's ``forward`` is the routing
    wrapper (``use_kernelized_func``) around the original (``__wrapped__``)."""
    routed = isinstance(module.__dict__.get("_kernel_funcs"), dict)
    wrapped = hasattr(type(module).forward, "__wrapped__")
    return routed and wrapped


def hub_kernelized(module: torch.nn.Module) -> bool:
    """Whether any of a routing layer's own hub-function copies has a kernel's ``forward``
    (``kernels.kernelize`` replaced it)."""
    funcs = module.__dict__["_kernel_funcs"].values()
    return any(f.forward.__func__ is not type(f).forward for f in funcs)
