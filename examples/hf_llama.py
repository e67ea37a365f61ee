"""A model file for ``ckptplan solve``: a tiny Hugging Face Llama built from a config.

Nothing is downloaded. For a real model return ``AutoModelForCausalLM.from_pretrained(name)``
from ``build_model`` (profiling builds it on fake tensors, so its size does not matter).
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 512
SEQ_LEN = 64


def build_model() -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=172,
        num_hidden_layers=4,
        num_attention_heads=4,
        max_position_embeddings=SEQ_LEN,
        attention_dropout=0.1,
    )
    return LlamaForCausalLM(config)


def example_inputs(batch_size: int = 8) -> dict[str, torch.Tensor | bool]:
    ids = torch.randint(0, VOCAB, (batch_size, SEQ_LEN))
    return {"input_ids": ids, "labels": ids, "use_cache": False}
