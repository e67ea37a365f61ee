"""A 12-layer Hugging Face Llama (``LlamaForCausalLM``) from a config: width 64, grouped-query
attention (4 heads, 2 key/value heads), attention dropout 0.1.

Deep enough that its run of identical decoder layers is profiled by replication
(``ckptplan.profiling.replicate``), small enough to trace whole in a second to compare against.
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
        num_hidden_layers=12,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ_LEN,
        attention_dropout=0.1,
        bos_token_id=0,
        eos_token_id=1,
    )
    return LlamaForCausalLM(config)


def example_inputs(batch_size: int = 4) -> dict[str, torch.Tensor | bool]:
    input_ids = torch.randint(0, VOCAB_SIZE, (batch_size, SEQ_LEN))
    return {"input_ids": input_ids, "labels": input_ids, "use_cache": False}
