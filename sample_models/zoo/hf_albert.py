"""ALBERT masked LM (Hugging Face transformers, AlbertForMaskedLM): one layer, shared.

Built from AlbertConfig with the library's defaults (one layer group of one layer whose
weights every layer shares, factorised embeddings, GELU-new, dropout 0 as ALBERT's defaults
set it, tied MLM head). Non-default: sizes only (6 layers, hidden 256, 4 heads, MLP 1024,
embeddings 128, vocab 1024, 512 positions). The shared layer group runs 6 times per forward:
each call is a unit of its own (``ckptplan.values.unit_names``). The labels are the input ids at
about 15% of the positions and -100 (ignored) elsewhere.
"""

import torch
from transformers import AlbertConfig, AlbertForMaskedLM

VOCAB = 1024
SEQ = 128


def build_model() -> torch.nn.Module:
    config = AlbertConfig(
        vocab_size=VOCAB,
        embedding_size=128,
        hidden_size=256,
        num_hidden_layers=6,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=512,
    )
    return AlbertForMaskedLM(config)


def example_inputs(batch_size: int = 8) -> dict:
    ids = torch.randint(0, VOCAB, (batch_size, SEQ))
    labels = torch.where(torch.rand(batch_size, SEQ) < 0.15, ids, torch.full_like(ids, -100))
    return {"input_ids": ids, "labels": labels}
