"""Mixtral sparse mixture-of-experts causal LM (Hugging Face transformers, MixtralForCausalLM).

Built from MixtralConfig with the library's defaults (top-2 routing, SiLU-gated experts,
grouped-query attention, router logits not returned so no auxiliary loss, use_cache at its
default). Non-default: sizes only (4 layers, hidden 256, expert MLP 512, 4 experts,
4 query heads / 2 key-value heads, vocab 1024, 512 positions).
"""

import torch
from transformers import MixtralConfig, MixtralForCausalLM

VOCAB = 1024
SEQ = 256


def build_model() -> torch.nn.Module:
    config = MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        max_position_embeddings=512,
    )
    return MixtralForCausalLM(config)


def example_inputs(batch_size: int = 8) -> dict:
    ids = torch.randint(0, VOCAB, (batch_size, SEQ))
    return {"input_ids": ids, "labels": ids}
