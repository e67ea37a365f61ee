"""GPT-2 causal LM (Hugging Face transformers, GPT2LMHeadModel).

Built from GPT2Config with the library's defaults (dropout 0.1 on embeddings, attention and
residuals; tied LM head; use_cache at its default). Non-default: sizes only (4 layers,
hidden 256, 4 heads, vocab 1024, 256 positions).
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB = 1024
SEQ = 256


def build_model() -> torch.nn.Module:
    config = GPT2Config(vocab_size=VOCAB, n_positions=256, n_embd=256, n_layer=4, n_head=4)
    return GPT2LMHeadModel(config)


def example_inputs(batch_size: int = 8) -> dict:
    ids = torch.randint(0, VOCAB, (batch_size, SEQ))
    return {"input_ids": ids, "labels": ids}
