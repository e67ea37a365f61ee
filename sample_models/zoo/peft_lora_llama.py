"""LoRA fine-tuning of a Llama causal LM (peft get_peft_model over transformers LlamaForCausalLM).

The base model is hf_llama_gqa.py's (LlamaConfig defaults, grouped-query attention); peft
wraps it as a PeftModelForCausalLM with a LoraConfig on q_proj and v_proj, using peft's
defaults otherwise (lora_alpha 8, no LoRA dropout, no bias) and freezing every base
parameter as peft does. Non-default: sizes only (4 layers, hidden 256, 8 query / 2 key-value
heads, vocab 1024, LoRA rank 8).
"""

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 1024
SEQ = 256


def build_model() -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    lora = LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    return get_peft_model(LlamaForCausalLM(config), lora)


def example_inputs(batch_size: int = 8) -> dict:
    ids = torch.randint(0, VOCAB, (batch_size, SEQ))
    return {"input_ids": ids, "labels": ids}
