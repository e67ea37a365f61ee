"""Gemma causal LM (Hugging Face transformers, GemmaForCausalLM).

Built from GemmaConfig with the library's defaults (GeGLU MLP with tanh GELU, RMSNorm with
(1 + weight), embeddings scaled by sqrt(hidden), tied head, use_cache at its default).
Non-default: sizes only (4 layers, hidden 256, MLP 1024, 4 query heads / 1 key-value head
of dim 64, vocab 1024, 512 positions).
"""

import torch
from transformers import GemmaConfig, GemmaForCausalLM

VOCAB = 1024
SEQ = 256


def build_model() -> torch.nn.Module:
    config = GemmaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=512,
    )
    return GemmaForCausalLM(config)


def example_inputs(batch_size: int = 8) -> dict:
    ids = torch.randint(0, VOCAB, (batch_size, SEQ))
    return {"input_ids": ids, "labels": ids}
