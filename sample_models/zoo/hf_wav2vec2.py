"""Wav2Vec2 speech recognition with CTC (Hugging Face transformers, Wav2Vec2ForCTC).

Built from Wav2Vec2Config with the library's defaults: LayerDrop 0.1 (each encoder layer is
skipped at random in training, decided by a ``torch.rand`` draw in the encoder's loop), dropout
0.1, SpecAugment time masking (``mask_time_prob`` 0.05, drawn with NumPy), the 7-layer conv
feature encoder with group norm, post-LN layers, CTC loss summed. Non-default: sizes only
(6 layers, hidden 256, 4 heads, MLP 1024, conv channels 32, 16 positional conv groups).
``LAYERDROP`` in the environment sets the LayerDrop probability (the benchmark runs 0.1 and 0.3).
"""

import os

import torch
from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

SAMPLES = 16000
"""One second of 16 kHz audio: 49 frames after the feature encoder."""
LABEL_LEN = 6


def build_model() -> torch.nn.Module:
    config = Wav2Vec2Config(
        hidden_size=256,
        num_hidden_layers=6,
        num_attention_heads=4,
        intermediate_size=1024,
        conv_dim=(32,) * 7,
        num_conv_pos_embedding_groups=16,
        layerdrop=float(os.environ.get("LAYERDROP", "0.1")),
    )
    return Wav2Vec2ForCTC(config)


def example_inputs(batch_size: int = 8) -> dict:
    audio = torch.randn(batch_size, SAMPLES)
    labels = torch.randint(1, 32, (batch_size, LABEL_LEN))
    return {"input_values": audio, "labels": labels}
