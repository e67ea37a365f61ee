"""DeepSeek-V3 causal LM (Hugging Face transformers, DeepseekV3ForCausalLM): multi-head latent
attention and a routed mixture of experts.

Built from DeepseekV3Config with the library's defaults (low-rank query and key-value
projections with a decoupled rotary part, sigmoid top-k routing over expert groups, one shared
expert, the first layers dense, the experts run by the library's default experts
implementation). Non-default: sizes only (4 layers, the first dense, hidden 256, 4 heads,
8 routed experts in 2 groups, top-2, vocab 1024, 512 positions, small latent ranks).
"""

import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

VOCAB = 1024
SEQ = 64


def build_model() -> torch.nn.Module:
    config = DeepseekV3Config(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_hidden_layers=4,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=8,
        n_group=2,
        topk_group=1,
        num_experts_per_tok=2,
        q_lora_rank=64,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=32,
        v_head_dim=32,
        max_position_embeddings=512,
    )
    return DeepseekV3ForCausalLM(config)


def example_inputs(batch_size: int = 2) -> dict:
    ids = torch.randint(0, VOCAB, (batch_size, SEQ))
    return {"input_ids": ids, "labels": ids}
