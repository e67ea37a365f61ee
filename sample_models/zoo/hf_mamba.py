"""Mamba selective state-space causal LM (Hugging Face transformers, MambaForCausalLM).

Built from MambaConfig with the library's defaults (expand 2, state 16, causal conv of 4,
residual in fp32, tied LM head, use_cache at its default). Without the mamba-ssm kernels
installed the library runs its slow path: the scan is a Python loop over the sequence, so each
layer's ``A_log``, ``D`` and projections feed many ops. Non-default: sizes only (4 layers,
hidden 128, vocab 1024).
"""

import torch
from transformers import MambaConfig, MambaForCausalLM

VOCAB = 1024
SEQ = 64


def build_model() -> torch.nn.Module:
    config = MambaConfig(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=4)
    return MambaForCausalLM(config)


def example_inputs(batch_size: int = 4) -> dict:
    ids = torch.randint(0, VOCAB, (batch_size, SEQ))
    return {"input_ids": ids, "labels": ids}
