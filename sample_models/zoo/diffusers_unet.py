"""Text-conditioned latent-diffusion U-Net (diffusers, UNet2DConditionModel).

Built from the model's own config arguments with the library's defaults (ResNet blocks with
GroupNorm(32) and SiLU, sinusoidal timestep embedding, spatial transformers with self- and
cross-attention, skip connections, upsampling by interpolation). Non-default: sizes only
(two resolution levels of 32 and 64 channels, one cross-attention level, 16x16x4 latents,
cross-attention width 32 over 16 text tokens, head dim 8). The loss is the MSE of the
predicted noise against a zero target.
"""

import torch
from diffusers import UNet2DConditionModel

SAMPLE_SIZE = 16
CROSS_DIM = 32
TEXT_LEN = 16


def build_model() -> torch.nn.Module:
    return UNet2DConditionModel(
        sample_size=SAMPLE_SIZE,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=CROSS_DIM,
        attention_head_dim=8,
    )


def example_inputs(batch_size: int = 8) -> dict:
    return {
        "sample": torch.randn(batch_size, 4, SAMPLE_SIZE, SAMPLE_SIZE),
        "timestep": torch.randint(0, 1000, (batch_size,)),
        "encoder_hidden_states": torch.randn(batch_size, TEXT_LEN, CROSS_DIM),
    }


def loss_fn(output) -> torch.Tensor:
    return output.sample.float().pow(2).mean()
