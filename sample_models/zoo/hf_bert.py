"""BERT masked LM (Hugging Face transformers, BertForMaskedLM).

Built from BertConfig with the library's defaults (post-LN, GELU, dropout 0.1 on hidden
states and attention probabilities, tied MLM head, absolute positions). Non-default: sizes
only (4 layers, hidden 256, 4 heads, MLP 1024, vocab 1024, 512 positions). The labels are the
input ids at about 15% of the positions and -100 (ignored) elsewhere.
"""

import torch
from transformers import BertConfig, BertForMaskedLM

VOCAB = 1024
SEQ = 128


def build_model() -> torch.nn.Module:
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=512,
    )
    return BertForMaskedLM(config)


def example_inputs(batch_size: int = 8) -> dict:
    ids = torch.randint(0, VOCAB, (batch_size, SEQ))
    labels = torch.where(torch.rand(batch_size, SEQ) < 0.15, ids, torch.full_like(ids, -100))
    return {"input_ids": ids, "labels": labels}
