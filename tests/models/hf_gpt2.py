"""A tiny Hugging Face GPT-2 (``GPT2LMHeadModel``): 4 layers, width 64, dropout 0.1.

Built from a config, so nothing is downloaded. The inputs are keyword arguments with
``labels``, so the forward returns the language-model loss (the default loss of a model
file), and ``use_cache=False``, because a training step keeps no key/value cache. 16
sequences of 64 tokens make the activations outweigh the weights, as in real training.
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB_SIZE = 512
SEQ_LEN = 64


def build_model() -> torch.nn.Module:
    config = GPT2Config(
        vocab_size=VOCAB_SIZE,
        n_positions=SEQ_LEN,
        n_embd=64,
        n_layer=4,
        n_head=4,
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        attn_pdrop=0.1,
        bos_token_id=VOCAB_SIZE - 1,
        eos_token_id=VOCAB_SIZE - 1,
    )
    return GPT2LMHeadModel(config)


def example_inputs(batch_size: int = 16) -> dict[str, torch.Tensor | bool]:
    input_ids = torch.randint(0, VOCAB_SIZE, (batch_size, SEQ_LEN))
    return {"input_ids": input_ids, "labels": input_ids, "use_cache": False}
