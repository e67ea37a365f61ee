"""Qwen2 causal LM (Hugging Face transformers, Qwen2ForCausalLM).

Built from Qwen2Config with the library's defaults (RMSNorm, rotary embeddings, biased
q/k/v projections, grouped-query attention, no sliding window, use_cache at its default).
Non-default: sizes only (4 layers, hidden 256, MLP 704, 8 query heads / 2 key-value heads,
vocab 1024, 512 positions).
"""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

VOCAB = 1024
SEQ = 256


def build_model() -> torch.nn.Module:
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return Qwen2ForCausalLM(config)


def example_inputs(batch_size: int = 8) -> dict:
    ids = torch.randint(0, VOCAB, (batch_size, SEQ))
    return {"input_ids": ids, "labels": ids}
