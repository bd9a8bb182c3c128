"""The GPT-2-style decoder ``workloads.training.gpt`` trains, and the flops arithmetic behind MFU.

A minimal model, as the fast reference setups (nanoGPT, llm.c) build it: pre-LayerNorm blocks,
``F.scaled_dot_product_attention(is_causal=True)`` (flash attention on H100/H200 in bf16), GELU
MLP, tied input/output embedding, GPT-2 initialisation. Nothing is downloaded.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2)
                   for z in self.qkv(self.ln_1(x)).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class Head(nn.Module):
    """Final LayerNorm, logits through the tied embedding, cross-entropy in fp32."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = F.linear(self.ln_f(x), weight)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


class GPT(nn.Module):
    def __init__(self, n_layer: int, n_head: int, d_model: int, vocab_size: int, seq_len: int,
                 stream_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        # The residual stream's dtype. None keeps autocast's: fp32, since the embeddings are fp32. bf16 is
        # Megatron's default (a bf16 residual connection): the stream is read and written about a dozen times
        # per layer and step, and in bf16 each costs half the memory traffic.
        self.stream_dtype = stream_dtype
        self.wte, self.wpe = nn.Embedding(vocab_size, d_model), nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.head = Head(d_model)
        for name, p in self.named_parameters():  # GPT-2 init; residual projections scaled by depth
            if p.dim() == 1:
                nn.init.zeros_(p) if name.endswith("bias") else nn.init.ones_(p)
            else:
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layer) if "proj" in name else 0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        if self.stream_dtype is not None:
            x = x.to(self.stream_dtype)
        for block in self.blocks:
            x = block(x)
        return self.head(x, self.wte.weight, targets)


def matmul_params(model: GPT) -> int:
    """N of the flops formula: every parameter but the position embedding (a lookup, no matmul).
    The token embedding counts once: tied, it is the output layer's matmul."""
    return sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()


def flops_per_token(n_params: int, n_layer: int, d_model: int, seq_len: int) -> int:
    """Training flops per token (forward + backward), PaLM appendix B: 6N + 12 L d T."""
    return 6 * n_params + 12 * n_layer * d_model * seq_len


def mfu(tokens_per_s: float, flops_token: float, peak_tflops: float) -> float:
    """Model flops utilisation: achieved model flops / the device's peak."""
    return tokens_per_s * flops_token / (peak_tflops * 1e12)
