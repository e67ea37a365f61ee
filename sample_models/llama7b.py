"""Llama-2-7B in plain PyTorch, for fake-tensor profiling: 6.74e9 parameters, 4096 tokens.

The Llama-2-7B shape (Touvron et al. 2023): 32 pre-norm decoder layers of width 4096 with
32 attention heads, RMSNorm, rotary position embeddings, a SwiGLU MLP of width 11008, causal
``F.scaled_dot_product_attention``, a 32000-token vocabulary and an untied LM head. The
forward takes token ids and targets and returns the next-token cross-entropy loss.

Why it is in the suite: it shows that ckptplan plans a model far larger than the machine it
runs on. Built for real it holds 27 GB of fp32 weights, so build it only under
``FakeTensorMode`` (as ``ckptplan solve`` does), e.g.
``ckptplan solve sample_models/llama7b.py --budget 80GB --target h100 --dtype bf16``.
The rotary cos/sin tables are computed once per forward, on the device of the input, and
passed to every layer as extra arguments, so consecutive layers may share a checkpoint.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB_SIZE = 32000
SEQ_LEN = 4096
N_LAYER = 32
N_HEAD = 32
N_EMBD = 4096
INTERMEDIATE = 11008
NORM_EPS = 1e-5
ROPE_THETA = 10000.0
INIT_STD = 0.02


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in fp32 as Llama does so bf16 training stays stable."""

    def __init__(self, dim: int, eps: float = NORM_EPS) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotary_tables(
    seq_len: int, head_dim: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, (seq_len, head_dim), made where the input lives.

    Computed from ``arange`` in fp32 rather than kept as a buffer, so ``model.to(bf16)``
    cannot round the frequencies and no value is read back to the host.
    """
    inv_freq = 1.0 / ROPE_THETA ** (
        torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    )
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        assert n_embd % n_head == 0
        self.n_head = n_head
        self.q_proj = nn.Linear(n_embd, n_embd, bias=False)
        self.k_proj = nn.Linear(n_embd, n_embd, bias=False)
        self.v_proj = nn.Linear(n_embd, n_embd, bias=False)
        self.o_proj = nn.Linear(n_embd, n_embd, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        shape = (B, T, self.n_head, C // self.n_head)
        q = self.q_proj(x).view(shape).transpose(1, 2)  # (B, heads, T, head_dim)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, n_embd: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(n_embd, hidden, bias=False)
        self.up_proj = nn.Linear(n_embd, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, n_embd: int, n_head: int, hidden: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(n_embd)
        self.self_attn = Attention(n_embd, n_head)
        self.post_attention_layernorm = RMSNorm(n_embd)
        self.mlp = MLP(n_embd, hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(
        self,
        vocab_size: int = VOCAB_SIZE,
        n_layer: int = N_LAYER,
        n_head: int = N_HEAD,
        n_embd: int = N_EMBD,
        intermediate: int = INTERMEDIATE,
    ) -> None:
        super().__init__()
        self.n_head = n_head
        self.embed_tokens = nn.Embedding(vocab_size, n_embd)
        self.layers = nn.ModuleList(
            [DecoderLayer(n_embd, n_head, intermediate) for _ in range(n_layer)]
        )
        self.norm = RMSNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(idx)
        head_dim = x.shape[-1] // self.n_head
        cos, sin = rotary_tables(idx.shape[1], head_dim, idx.device, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def build_model() -> nn.Module:
    return Llama()


def example_inputs(batch_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, VOCAB_SIZE, (batch_size, SEQ_LEN))
    targets = torch.randint(0, VOCAB_SIZE, (batch_size, SEQ_LEN))
    return (idx, targets)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output
