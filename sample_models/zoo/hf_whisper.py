"""Whisper speech encoder-decoder (Hugging Face transformers, WhisperForConditionalGeneration).

Built from WhisperConfig with the library's defaults (80 mel bins, two conv stem layers, GELU,
pre-LN, the default 51,865-token vocabulary and special token ids, tied head, decoder inputs
made by shifting the labels right, use_cache at its default). Non-default: sizes only
(2 encoder + 2 decoder layers, d_model 128, 4 heads, MLP 512, 100 encoder positions so the
log-mel input is 200 frames instead of 3000).
"""

import torch
from transformers import WhisperConfig, WhisperForConditionalGeneration

MAX_SOURCE_POSITIONS = 100
TGT_LEN = 32


def build_model() -> torch.nn.Module:
    config = WhisperConfig(
        d_model=128,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=512,
        decoder_ffn_dim=512,
        max_source_positions=MAX_SOURCE_POSITIONS,
    )
    return WhisperForConditionalGeneration(config)


def example_inputs(batch_size: int = 8) -> dict:
    features = torch.randn(batch_size, 80, 2 * MAX_SOURCE_POSITIONS)
    labels = torch.randint(0, 50000, (batch_size, TGT_LEN))
    return {"input_features": features, "labels": labels}
