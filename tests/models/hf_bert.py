"""A tiny Hugging Face BERT (``BertForMaskedLM``): 4 layers, width 64, dropout 0.1.

Built from a config, so nothing is downloaded. The batch is a masked-language-model batch:
``labels`` hold the token at about 15% of the positions and -100 (ignored) elsewhere, with an
``attention_mask``, so the encoder runs its padding-mask code on the way to the loss.
"""

import torch
from transformers import BertConfig, BertForMaskedLM

VOCAB_SIZE = 512
SEQ_LEN = 64
MASK_FRACTION = 0.15


def build_model() -> torch.nn.Module:
    config = BertConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=SEQ_LEN,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    return BertForMaskedLM(config)


def example_inputs(batch_size: int = 16) -> dict[str, torch.Tensor]:
    input_ids = torch.randint(1, VOCAB_SIZE, (batch_size, SEQ_LEN))
    masked = torch.rand(batch_size, SEQ_LEN) < MASK_FRACTION
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones(batch_size, SEQ_LEN, dtype=torch.long),
        "labels": torch.where(masked, input_ids, torch.full_like(input_ids, -100)),
    }
