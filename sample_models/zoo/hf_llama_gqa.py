"""Llama causal LM with grouped-query attention (Hugging Face transformers, LlamaForCausalLM).

Built from LlamaConfig with the library's defaults (RMSNorm, rotary embeddings, SiLU-gated
MLP, untied head, no dropout, use_cache at its default). Non-default: sizes only (4 layers,
hidden 256, MLP 688, 8 query heads sharing 2 key/value heads, vocab 1024, 512 positions).
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 1024
SEQ = 256


def build_model() -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(config)


def example_inputs(batch_size: int = 8) -> dict:
    ids = torch.randint(0, VOCAB, (batch_size, SEQ))
    return {"input_ids": ids, "labels": ids}
