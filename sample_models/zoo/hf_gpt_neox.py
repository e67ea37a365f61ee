"""GPT-NeoX causal LM (Hugging Face transformers, GPTNeoXForCausalLM; the Pythia layout).

Built from GPTNeoXConfig with the library's defaults (parallel attention + MLP residual,
partial rotary embeddings, fused QKV, untied head, use_cache at its default). Non-default:
sizes only (4 layers, hidden 256, 4 heads, MLP 1024, vocab 1024, 512 positions).
"""

import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

VOCAB = 1024
SEQ = 256


def build_model() -> torch.nn.Module:
    config = GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=512,
    )
    return GPTNeoXForCausalLM(config)


def example_inputs(batch_size: int = 8) -> dict:
    ids = torch.randint(0, VOCAB, (batch_size, SEQ))
    return {"input_ids": ids, "labels": ids}
