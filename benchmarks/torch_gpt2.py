"""A PyTorch GPT-2 with the same architecture and parameter names as infinitrain's (the shape of
llm.c's train_gpt2.py), for comparisons: numerics in the tests, speed in the benchmark."""
from __future__ import annotations


import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.n_head = H
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(C), CausalSelfAttention(C, H), nn.LayerNorm(C)
        self.mlp = nn.Sequential()
        self.mlp.c_fc = nn.Linear(C, 4 * C)
        self.mlp.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class TorchGPT2(nn.Module):
    """vocab is the padded vocabulary (rows past `real_vocab` never enter the loss)."""

    def __init__(self, L, H, C, vocab, block_size, real_vocab):
        super().__init__()
        self.real_vocab = real_vocab
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, C), wpe=nn.Embedding(block_size, C),
            h=nn.ModuleList(Block(C, H) for _ in range(L)), ln_f=nn.LayerNorm(C)))
        self.lm_head = nn.Linear(C, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(T, device=idx.device))
        for b in self.transformer.h:
            x = b(x)
        logits = self.lm_head(self.transformer.ln_f(x))[..., :self.real_vocab]
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def from_infinitrain(model) -> TorchGPT2:
    """The same weights in a PyTorch model."""
    c = model.config
    t = TorchGPT2(c.n_layer, c.n_head, c.n_embd, c.padded_vocab_size, c.block_size, c.vocab_size)
    sd = {k: torch.from_numpy(np.array(v.float().numpy())) for k, v in model.state_dict().items()}
    t.load_state_dict(sd)
    return t
