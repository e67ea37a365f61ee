"""CLIP image-text two-tower model (Hugging Face transformers, CLIPModel, return_loss=True).

Built from CLIPConfig with the library's defaults (quick-GELU, pre-LN towers, causal text
mask, pooling at the end-of-text token, learned logit scale, the default 49,408-token text
vocabulary, contrastive loss). Non-default: sizes only (2 text + 2 vision layers, hidden 256,
4 heads, MLP 1024, projection 64, 64x64 images in 8x8 patches, 32-token texts).
"""

import torch
from transformers import CLIPConfig, CLIPModel

TEXT_LEN = 32
IMAGE_SIZE = 64
EOS_TOKEN_ID = 49407  # CLIPTextConfig's default eos_token_id


def build_model() -> torch.nn.Module:
    tower = {
        "hidden_size": 256,
        "intermediate_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    }
    config = CLIPConfig(
        text_config={**tower, "max_position_embeddings": TEXT_LEN},
        vision_config={**tower, "image_size": IMAGE_SIZE, "patch_size": 8},
        projection_dim=64,
    )
    return CLIPModel(config)


def example_inputs(batch_size: int = 16) -> dict:
    input_ids = torch.randint(0, EOS_TOKEN_ID - 1, (batch_size, TEXT_LEN))
    input_ids[:, -1] = EOS_TOKEN_ID
    pixel_values = torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE)
    return {"input_ids": input_ids, "pixel_values": pixel_values, "return_loss": True}
