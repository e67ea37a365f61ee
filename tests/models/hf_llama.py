"""A tiny Hugging Face Llama (``LlamaForCausalLM``): 4 layers, width 64, attention dropout 0.1.

Built from a config, so nothing is downloaded. Every decoder layer receives the rotary
position embeddings and the causal mask as keyword arguments next to the hidden states,
which is the calling convention checkpointing must pass through. ``labels`` make the forward
return the loss; ``use_cache=False`` because a training step keeps no key/value cache.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB_SIZE = 512
SEQ_LEN = 64


def build_model() -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=172,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=SEQ_LEN,
        attention_dropout=0.1,
        bos_token_id=0,
        eos_token_id=1,
    )
    return LlamaForCausalLM(config)


def example_inputs(batch_size: int = 16) -> dict[str, torch.Tensor | bool]:
    input_ids = torch.randint(0, VOCAB_SIZE, (batch_size, SEQ_LEN))
    return {"input_ids": input_ids, "labels": input_ids, "use_cache": False}
