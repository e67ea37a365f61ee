"""DeBERTa-v2 sequence classifier (Hugging Face transformers, DebertaV2ForSequenceClassification).

Built from DebertaV2Config with the library's defaults (GELU, dropout 0.1 on hidden states
and attention probabilities, context pooler, two labels, cross-entropy loss over the
labelled rows; relative attention off, as in the config's defaults). Non-default: sizes
only (4 layers, hidden 256, 4 heads, MLP 1024, vocab 1024, 512 positions).
"""

import torch
from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

VOCAB = 1024
SEQ = 128


def build_model() -> torch.nn.Module:
    config = DebertaV2Config(
        vocab_size=VOCAB,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=512,
    )
    return DebertaV2ForSequenceClassification(config)


def example_inputs(batch_size: int = 8) -> dict:
    ids = torch.randint(0, VOCAB, (batch_size, SEQ))
    labels = torch.randint(0, 2, (batch_size,))
    return {"input_ids": ids, "labels": labels}
