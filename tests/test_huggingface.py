"""The Hugging Face conventions (``ckptplan.huggingface``) checked against the transformers that
is installed: tiny models built from configs (no weights are read) are recognised, their loss
read, their cache and checkpointing flags found, their hub-routed layers and log noise matched."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ckptplan.huggingface import (  # noqa: E402
    AUTO_CLASSES,
    INPUT_IDS,
    LABELS,
    LAYERDROP,
    LOG_NOISE,
    MASKING_MODULE,
    PACKED_SEQUENCES,
    PIXEL_VALUES,
    architecture_task,
    checkpointing_disable,
    checkpointing_layers,
    checkpointing_on,
    configs,
    gives_positions,
    hub_kernelized,
    is_hub_name,
    output_loss,
    routes_hub_functions,
    training_conventions,
)
from tests.test_reports import Said  # noqa: E402

TOKENS = {"vocab_size": 64, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
BERT = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "max_position_embeddings": 32,
}
CONFIGS = {
    "causal-lm": lambda: transformers.GPT2Config(
        n_embd=16, n_layer=2, n_head=2, n_positions=32, **TOKENS
    ),
    "masked-lm": lambda: transformers.BertConfig(vocab_size=64, **BERT),
    "seq2seq-lm": lambda: transformers.T5Config(
        d_model=16, d_ff=32, d_kv=8, num_layers=1, num_heads=2, decoder_start_token_id=0, **TOKENS
    ),
    "sequence-classification": lambda: transformers.BertConfig(vocab_size=64, **BERT),
    "image-classification": lambda: transformers.ViTConfig(
        image_size=16, patch_size=8, num_labels=3, **BERT
    ),
}


def tiny_gpt2() -> Any:
    return transformers.GPT2LMHeadModel(CONFIGS["causal-lm"]()).train()


def tiny_llama() -> Any:
    config = transformers.LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
        **TOKENS,
    )
    return transformers.LlamaForCausalLM(config).train()


def test_only_a_string_with_the_prefix_names_a_hub_model() -> None:
    assert is_hub_name("hf:meta-llama/Llama-3.2-1B")
    assert is_hub_name("hf:./my-config")
    assert not is_hub_name(Path("hf:gpt2"))  # a path object is a model file
    assert not is_hub_name("model.py")
    assert not is_hub_name(None)


@pytest.mark.parametrize("task", sorted(AUTO_CLASSES))
def test_each_tasks_auto_class_builds_an_architecture_that_names_the_task(task: str) -> None:
    auto = getattr(transformers, AUTO_CLASSES[task])
    model = auto.from_config(CONFIGS[task]())
    assert architecture_task(type(model).__name__) == task


def test_a_base_model_names_no_task() -> None:
    assert architecture_task(type(transformers.BertModel(CONFIGS["masked-lm"]())).__name__) is None


def test_the_models_own_loss_is_read_only_when_it_computed_one() -> None:
    model = tiny_gpt2()
    ids = torch.randint(0, 64, (2, 8))
    labelled = model(**{INPUT_IDS: ids, LABELS: ids})
    loss = output_loss(labelled)
    assert loss is labelled.loss
    assert loss is not None and loss.requires_grad
    assert output_loss(model(**{INPUT_IDS: ids})) is None  # no labels, no loss
    assert output_loss((torch.ones(2),)) is None
    assert output_loss(types.SimpleNamespace(loss=3.0)) is None  # not a tensor


def test_an_image_model_takes_its_batch_by_the_names_given() -> None:
    config = CONFIGS["image-classification"]()
    model = transformers.ViTForImageClassification(config).train()
    pixels = torch.randn(2, config.num_channels, config.image_size, config.image_size)
    loss = output_loss(model(**{PIXEL_VALUES: pixels, LABELS: torch.tensor([0, 2])}))
    assert loss is not None and loss.requires_grad


def test_every_config_a_model_holds_is_found_once() -> None:
    model = tiny_gpt2()
    assert configs(model) == [model.config]  # every block shares the model's
    t5 = transformers.T5ForConditionalGeneration(CONFIGS["seq2seq-lm"]())
    found = configs(t5)
    assert len({id(c) for c in found}) == len(found) == 3  # the model's and each half's copy
    assert any(c is t5.config for c in found)
    assert configs(torch.nn.Linear(2, 2)) == []


def test_training_turns_the_cache_off_in_the_model_and_the_batch() -> None:
    t5 = transformers.T5ForConditionalGeneration(CONFIGS["seq2seq-lm"]())
    assert any(c.use_cache for c in configs(t5))
    batch = {"input_ids": torch.zeros(1, 4, dtype=torch.long), "use_cache": True}
    inputs, notes = training_conventions(t5, batch)
    assert not any(c.use_cache for c in configs(t5))
    assert inputs["use_cache"] is False and batch["use_cache"] is True  # the caller's kept
    assert notes == ("the key/value cache (use_cache) is off, as in training",)
    assert training_conventions(t5, inputs) == (inputs, ())  # nothing left to change


def test_a_model_without_a_cache_is_left_as_it_is() -> None:
    batch = (torch.ones(1, 2),)
    assert training_conventions(torch.nn.Linear(2, 2), batch) == (batch, ())


def test_the_layers_huggingface_checkpointing_switches_on_are_found() -> None:
    model = tiny_llama()
    layers = checkpointing_layers([model])
    assert layers == list(model.model.layers)
    assert checkpointing_layers([torch.nn.Sequential(torch.nn.Linear(2, 2))]) == []
    assert checkpointing_disable(model) is None
    assert not any(checkpointing_on(layer) for layer in layers)

    model.activation_checkpointing_enable()
    assert all(checkpointing_on(layer) for layer in layers)
    disable = checkpointing_disable(model)
    assert disable == "activation_checkpointing_disable"
    getattr(model, disable)()  # the method named is the one that switches it off
    assert not any(checkpointing_on(layer) for layer in layers)
    assert checkpointing_disable(model) is None


def test_a_model_with_only_the_older_flag_is_told_the_older_method() -> None:
    module = torch.nn.Linear(2, 2)
    assert checkpointing_disable(module) is None
    module.is_gradient_checkpointing = True
    assert checkpointing_disable(module) == "gradient_checkpointing_disable"


def test_the_hub_routed_layers_are_found_and_kernelizing_is_seen() -> None:
    pytest.importorskip("kernels")
    model = tiny_llama()
    routed = [name for name, m in model.named_modules() if routes_hub_functions(m)]
    assert routed == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    attention = model.get_submodule(routed[0])
    assert not hub_kernelized(attention)

    (copy_,) = attention.__dict__["_kernel_funcs"].values()
    copy_.forward = types.MethodType(lambda self, *args: type(self).forward(self, *args), copy_)
    assert hub_kernelized(attention)


def test_the_mask_question_is_where_transformers_keeps_it() -> None:
    __import__(MASKING_MODULE)
    assert callable(getattr(sys.modules[MASKING_MODULE], PACKED_SEQUENCES))
    assert gives_positions({"input_ids": 1, "position_ids": 2})
    assert not gives_positions({"input_ids": 1})
    assert not gives_positions((1, 2))


def test_the_noise_dropped_is_what_transformers_logs() -> None:
    """A model class with no loss of its name warns, once per message, from the logger named."""
    ((name, pattern),) = LOG_NOISE.items()
    handler = Said()
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        model = tiny_gpt2()
        model.loss_type = "ckptplan_test_no_such_loss"  # a message not warned before
        assert model.loss_function is not None
    finally:
        logger.removeHandler(handler)
    warned = [m for m in handler.messages if "ckptplan_test_no_such_loss" in m]
    assert len(warned) == 1 and pattern.search(warned[0])


def test_the_layerdrop_names_are_where_a_model_keeps_its_probability() -> None:
    config = transformers.BartConfig(
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
        encoder_layerdrop=0.1,
        decoder_layerdrop=0.2,
        **TOKENS,
    )
    model = transformers.BartForConditionalGeneration(config)
    owners = (*model.modules(), *configs(model))
    found = {n for o in owners for n in LAYERDROP if (getattr(o, n, 0.0) or 0.0) > 0}
    assert found == set(LAYERDROP)
