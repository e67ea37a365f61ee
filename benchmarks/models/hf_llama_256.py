"""Hugging Face ``LlamaForCausalLM`` as a new user builds it: 12 layers, width 256, 4 heads,
MLP 688, 256-token sequences, the library's defaults otherwise (attention implementation,
``kernels`` hub layers where transformers installs them, no dropout).

Built from a config, so nothing is downloaded. ``labels`` make the forward return the loss;
``use_cache=False`` because a training step keeps no key/value cache.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB_SIZE = 8192
SEQ_LEN = 256


def build_model() -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=12,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=SEQ_LEN,
    )
    return LlamaForCausalLM(config)


def example_inputs(batch_size: int = 4) -> dict[str, torch.Tensor | bool]:
    input_ids = torch.randint(0, VOCAB_SIZE, (batch_size, SEQ_LEN))
    return {"input_ids": input_ids, "labels": input_ids, "use_cache": False}
