"""A model file for the integration examples: a tiny Hugging Face GPT-2 built from a config.

Nothing is downloaded (for a real model, ``from_pretrained`` goes in ``build_model``). Dropout
is on, as in training, so the examples' gradient checks cover checkpointing's replay of it.
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB = 256
SEQ_LEN = 32


def build_model() -> torch.nn.Module:
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ_LEN,
        n_embd=32,
        n_layer=3,
        n_head=2,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
    )
    return GPT2LMHeadModel(config)


def example_inputs(batch_size: int = 4) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (batch_size, SEQ_LEN))
    return {"input_ids": ids, "labels": ids}
