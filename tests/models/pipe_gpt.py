"""A tiny decoder laid out for pipelining as torchtitan's models are: its layers in a
ModuleDict, so a stage's module is the whole model with the other layers deleted (their
qualified names ``layers.N`` kept), and the embeddings or the head set to None off the first
or last stage. Dropout on."""

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, DEPTH, CONTEXT = 64, 32, 6, 32


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, 4, dropout=0.1, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1)
        h = self.norm1(x)
        x = x + self.drop(self.attn(h, h, h, attn_mask=mask, need_weights=False)[0])
        return x + self.drop(self.mlp(self.norm2(x)))


class PipeGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed: nn.Module | None = nn.Embedding(VOCAB, WIDTH)
        self.pos: nn.Module | None = nn.Embedding(CONTEXT, WIDTH)
        self.layers = nn.ModuleDict({str(i): Block(WIDTH) for i in range(DEPTH)})
        self.head: nn.Module | None = nn.Linear(WIDTH, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens to logits; a stage without embeddings takes hidden states, one without the
        head returns them."""
        if self.embed is not None:
            x = self.embed(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for layer in self.layers.values():
            x = layer(x)
        return x if self.head is None else self.head(x)


def stage_module(model: PipeGPT, blocks: list[str], first: bool, last: bool) -> PipeGPT:
    """``model`` cut to one stage: the layers of ``blocks`` (``layers.N``) under their names."""
    keep = {path.removeprefix("layers.") for path in blocks}
    for name in list(model.layers):
        if name not in keep:
            del model.layers[name]
    if not first:
        model.embed = model.pos = None
    if not last:
        model.head = None
    return model


def pipeline_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def build_model() -> nn.Module:
    return PipeGPT()


def example_inputs(batch_size: int = 8) -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, VOCAB, (batch_size, CONTEXT)),)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    """The pipeline's loss against targets of the same shape (their values do not change
    what the step allocates): the last stage's ``cross_entropy(logits, targets)``."""
    targets = torch.zeros(output.shape[:2], dtype=torch.long, device=output.device)
    return pipeline_loss(output, targets)
