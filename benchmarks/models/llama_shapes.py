"""The Llama shapes of ``benchmarks/scale.py``, as Hugging Face ``LlamaForCausalLM`` models.

Each shape is built from a ``LlamaConfig`` with its published sizes (nothing is downloaded, no
weights are read), so build it only under ``FakeTensorMode``, as ``ckptplan solve`` does: the
405B shape holds 1.6 TB of fp32 weights. A shape at a sequence length is an object with
``build_model`` and ``example_inputs``, named as ``MODULE:NAME``:

    ckptplan solve benchmarks.models.llama_shapes:llama2_70b_4k --budget 80GB --target h100 \\
        --dtype bf16 --world-size 8 --fsdp

Example:
    >>> llama2_70b().at(32768).example_inputs()["input_ids"].shape
    torch.Size([1, 32768])
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM


@dataclass(frozen=True)
class LlamaShape:
    """A Llama decoder's published sizes and the tokens of one training sequence."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    max_positions: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    seq_len: int = 4096

    def at(self, seq_len: int) -> LlamaShape:
        """The same model trained on sequences of ``seq_len`` tokens."""
        return replace(self, seq_len=seq_len)

    def config(self) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=max(self.max_positions, self.seq_len),
            rope_theta=self.rope_theta,
            rope_scaling=dict(self.rope_scaling) if self.rope_scaling else None,
            rms_norm_eps=self.rms_norm_eps,
            tie_word_embeddings=False,
            use_cache=False,
        )

    def build_model(self) -> torch.nn.Module:
        return LlamaForCausalLM(self.config())

    def example_inputs(self, batch_size: int = 1) -> dict[str, torch.Tensor | bool]:
        """Token ids that are their own labels (the forward returns the loss)."""
        input_ids = torch.randint(0, self.vocab, (batch_size, self.seq_len))
        return {"input_ids": input_ids, "labels": input_ids, "use_cache": False}


def llama2_7b() -> LlamaShape:
    """Llama-2-7B (Touvron et al. 2023): 32 layers of width 4096, 32 heads, no GQA."""
    return LlamaShape("llama2-7b", 4096, 32, 32, 32, 11008, 32000, 4096)


def llama2_70b() -> LlamaShape:
    """Llama-2-70B: 80 layers of width 8192, 64 heads sharing 8 key/value heads."""
    return LlamaShape("llama2-70b", 8192, 80, 64, 8, 28672, 32000, 4096)


def llama3_405b() -> LlamaShape:
    """Llama-3.1-405B: 126 layers of width 16384, 128 heads over 8 key/value heads, a 128k
    vocabulary, rotary base 500000 with Llama 3's frequency scaling."""
    scaling = (
        ("rope_type", "llama3"),
        ("factor", 8.0),
        ("low_freq_factor", 1.0),
        ("high_freq_factor", 4.0),
        ("original_max_position_embeddings", 8192),
    )
    return LlamaShape(
        "llama3-405b", 16384, 126, 128, 8, 53248, 128256, 131072, 500000.0, 1e-5, scaling
    )


llama2_7b_4k = llama2_7b()
llama2_7b_32k = llama2_7b().at(32768)
llama2_7b_128k = llama2_7b().at(131072)
llama2_70b_4k = llama2_70b()
llama2_70b_32k = llama2_70b().at(32768)
llama2_70b_128k = llama2_70b().at(131072)
llama3_405b_4k = llama3_405b()
llama3_405b_32k = llama3_405b().at(32768)
llama3_405b_128k = llama3_405b().at(131072)
