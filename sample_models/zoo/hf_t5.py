"""T5 encoder-decoder (Hugging Face transformers, T5ForConditionalGeneration).

Built from T5Config with the library's defaults (relative position buckets, ReLU MLP,
dropout 0.1, tied and rescaled LM head, decoder inputs made by shifting the labels right,
use_cache at its default). Non-default: sizes only (4 encoder + 4 decoder layers, d_model
256, 4 heads of 64, MLP 1024, vocab 1024, 128-token inputs and labels), plus
decoder_start_token_id=0 (the pad id, as in every released T5 config): transformers 5's
T5Config no longer defines it, and shifting the labels right needs it.
"""

import torch
from transformers import T5Config, T5ForConditionalGeneration

VOCAB = 1024
SRC_LEN = 128
TGT_LEN = 128


def build_model() -> torch.nn.Module:
    config = T5Config(
        vocab_size=VOCAB,
        d_model=256,
        d_kv=64,
        d_ff=1024,
        num_layers=4,
        num_heads=4,
        decoder_start_token_id=0,
    )
    return T5ForConditionalGeneration(config)


def example_inputs(batch_size: int = 4) -> dict:
    input_ids = torch.randint(1, VOCAB, (batch_size, SRC_LEN))
    labels = torch.randint(1, VOCAB, (batch_size, TGT_LEN))
    return {"input_ids": input_ids, "labels": labels}
