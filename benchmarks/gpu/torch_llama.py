"""A PyTorch LLaMA-3 with infinitrain's architecture and parameter names (infinitrain.models.llama3:
RMSNorm, one fused Q/K/V projection with grouped-query heads, rotary embeddings on interleaved
pairs with LLaMA-3.1's scaling, SwiGLU, an untied head), for the GPU benchmark beside
benchmarks/torch_gpt2.py's GPT-2. Attention is PyTorch's scaled_dot_product_attention (its cuDNN
and FlashAttention backends on a GPU)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from infinitrain.models.llama3 import rope_frequencies


def rotate(x, cos, sin):
    """x [B, H, T, D] by the angles cos/sin [T, D/2], pairs (2i, 2i+1) rotated together."""
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.H, self.KV, self.D = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.c_attn = nn.Linear(cfg.n_embd, (self.H + 2 * self.KV) * self.D, bias=False)
        self.c_proj = nn.Linear(self.H * self.D, cfg.n_embd, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).split([self.H * self.D, self.KV * self.D, self.KV * self.D], -1)
        q, k, v = (t.view(B, T, -1, self.D).transpose(1, 2) for t in (q, k, v))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.KV != self.H)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, cfg.ffn_hidden, bias=False)   # up
        self.c_fc2 = nn.Linear(cfg.n_embd, cfg.ffn_hidden, bias=False)  # gate
        self.c_proj = nn.Linear(cfg.ffn_hidden, cfg.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.silu(self.c_fc2(x)) * self.c_fc(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1, self.attn = nn.RMSNorm(cfg.n_embd, eps=cfg.norm_eps), Attention(cfg)
        self.ln_2, self.mlp = nn.RMSNorm(cfg.n_embd, eps=cfg.norm_eps), MLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.ln_1(x), cos, sin)
        return x + self.mlp(self.ln_2(x))


class TorchLLaMA3(nn.Module):
    """cfg: an infinitrain LLaMA3Config (dense). Weights N(0, 0.02), as infinitrain draws them
    (its residual projections' smaller scale left out: it does not change the step's time)."""

    def __init__(self, cfg):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd), h=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
            ln_f=nn.RMSNorm(cfg.n_embd, eps=cfg.norm_eps)))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
        angles = np.outer(np.arange(cfg.block_size), rope_frequencies(cfg)).astype(np.float32)
        self.register_buffer("rope_cos", torch.from_numpy(np.cos(angles)), persistent=False)
        self.register_buffer("rope_sin", torch.from_numpy(np.sin(angles)), persistent=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = self.transformer.wte(idx)
        for block in self.transformer.h:
            x = block(x, cos, sin)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
