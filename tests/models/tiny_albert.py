"""A tiny ALBERT masked LM for fast tests: one layer group, shared by its 4 layers.

``sample_models/zoo/hf_albert.py`` is the zoo's size; this one profiles in a few seconds.
"""

import torch
from transformers import AlbertConfig, AlbertForMaskedLM

VOCAB = 256
SEQ = 32


def build_model() -> torch.nn.Module:
    config = AlbertConfig(
        vocab_size=VOCAB,
        embedding_size=32,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=256,
        max_position_embeddings=64,
    )
    return AlbertForMaskedLM(config)


def example_inputs(batch_size: int = 4) -> dict:
    ids = torch.randint(0, VOCAB, (batch_size, SEQ))
    labels = torch.where(torch.rand(batch_size, SEQ) < 0.15, ids, torch.full_like(ids, -100))
    return {"input_ids": ids, "labels": labels}
