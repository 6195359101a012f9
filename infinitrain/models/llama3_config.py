"""LLaMA-3's configuration and presets, dense and mixture-of-experts."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class LLaMA3Config:
    block_size: int = 8192
    vocab_size: int = 128256
    n_layer: int = 32
    n_head: int = 32
    n_kv_head: int = 8
    n_embd: int = 4096
    ffn_dim_multiplier: float | None = 1.3
    multiple_of: int = 1024
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    use_scaled_rope: bool = False
    rope_scaling_factor: float = 8.0  # LLaMA-3.1: 8, LLaMA-3.2: 32
    # Qwen3's two departures from LLaMA: heads wider than n_embd / n_head (Qwen3-30B-A3B: 32
    # heads of 128 over a width of 2048), and an RMSNorm over each head's queries and keys
    # before the rotation (QK-norm). llm.c's checkpoint format has neither.
    head_size: int | None = None
    qk_norm: bool = False
    # mixture of experts (Megatron's names): num_experts 0 is a dense model. Layer i has
    # experts when i % moe_layer_freq == 0; moe_ffn_hidden is each expert's width (None: the
    # dense ffn_hidden); moe_shared_experts shared experts of that width see every token;
    # moe_capacity_factor None is dropless; moe_bias_update_rate > 0 turns on DeepSeek-V3's
    # bias-based balancing (nn.moe)
    num_experts: int = 0
    moe_top_k: int = 2
    moe_ffn_hidden: int | None = None
    moe_shared_experts: int = 0
    moe_router: str = "softmax"
    moe_norm_topk_prob: bool = True
    moe_layer_freq: int = 1
    moe_aux_loss_coeff: float = 0.0
    moe_z_loss_coeff: float = 0.0
    moe_capacity_factor: float | None = None
    moe_bias_update_rate: float = 0.0

    @property
    def head_dim(self) -> int:
        return self.head_size or self.n_embd // self.n_head

    @property
    def ffn_hidden(self) -> int:
        hidden = 2 * (4 * self.n_embd) // 3
        if self.ffn_dim_multiplier:
            hidden = int(round(self.ffn_dim_multiplier * hidden))
        return (hidden + self.multiple_of - 1) // self.multiple_of * self.multiple_of

    @property
    def expert_ffn_hidden(self) -> int:
        """A routed expert's width."""
        return self.moe_ffn_hidden or self.ffn_hidden

    def is_moe_layer(self, i: int) -> bool:
        return self.num_experts > 0 and i % self.moe_layer_freq == 0

    def validate(self) -> None:
        for name in ("norm_eps", "rope_theta", "rope_scaling_factor"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        if self.head_size is not None and (type(self.head_size) is not int or self.head_size < 1):
            raise ValueError(f"head_size must be a positive integer (or None: n_embd / n_head), got {self.head_size!r}")
        if (self.head_size is None and self.n_embd % self.n_head) or self.n_head % self.n_kv_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head}), "
                             f"and n_head of n_kv_head ({self.n_kv_head})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        self.validate_moe()

    def validate_moe(self) -> None:
        def integer(name, low):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")

        integer("num_experts", 0)
        if self.num_experts == 0:
            return
        integer("moe_top_k", 1)
        if self.moe_top_k > self.num_experts:
            raise ValueError(f"moe_top_k ({self.moe_top_k}) must not exceed num_experts ({self.num_experts})")
        integer("moe_layer_freq", 1)
        integer("moe_shared_experts", 0)
        if self.moe_ffn_hidden is not None:
            integer("moe_ffn_hidden", 1)
        if self.moe_router not in ("softmax", "sigmoid"):
            raise ValueError(f"moe_router must be 'softmax' or 'sigmoid', got {self.moe_router!r}")
        for name in ("moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_bias_update_rate"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        f = self.moe_capacity_factor
        if f is not None and not (isinstance(f, (int, float)) and math.isfinite(f) and f > 0):
            raise ValueError(f"moe_capacity_factor must be a finite number > 0 (or None: dropless), got {f!r}")


_TINY = LLaMA3Config(block_size=256, vocab_size=50257, n_layer=2, n_head=4, n_kv_head=2, n_embd=64,
                     ffn_dim_multiplier=None, multiple_of=32, rope_theta=10000.0)
_SMALL = LLaMA3Config(block_size=1024, vocab_size=50257, n_layer=4, n_head=4, n_kv_head=2, n_embd=256,
                      ffn_dim_multiplier=None, multiple_of=64, rope_theta=10000.0)

PRESETS = {
    "llama3.2-1b": LLaMA3Config(block_size=8192, n_layer=16, n_head=32, n_kv_head=8, n_embd=2048,
                                ffn_dim_multiplier=1.5, multiple_of=256, use_scaled_rope=True,
                                rope_scaling_factor=32.0),
    "llama3.2-3b": LLaMA3Config(block_size=8192, n_layer=28, n_head=24, n_kv_head=8, n_embd=3072,
                                ffn_dim_multiplier=1.0, multiple_of=256, use_scaled_rope=True,
                                rope_scaling_factor=32.0),
    "llama3-8b": LLaMA3Config(block_size=8192, n_layer=32, n_head=32, n_kv_head=8, n_embd=4096,
                              ffn_dim_multiplier=1.3, multiple_of=1024),
    # quick runs on the GPT-2 vocabulary (Shakespeare data), and tests
    "small": _SMALL,
    "tiny": _TINY,
    "moe-small": replace(_SMALL, num_experts=8, moe_top_k=2, moe_ffn_hidden=256, moe_aux_loss_coeff=1e-2,
                         moe_z_loss_coeff=1e-3),
    "moe-tiny": replace(_TINY, num_experts=4, moe_top_k=2, moe_ffn_hidden=64, moe_aux_loss_coeff=1e-2,
                        moe_z_loss_coeff=1e-3),
    # shaped like Mixtral 8x7B (MixtralForCausalLM's config): 8 experts of width 14336, top 2
    "mixtral-8x7b": LLaMA3Config(block_size=32768, vocab_size=32000, n_layer=32, n_head=32, n_kv_head=8,
                                 n_embd=4096, ffn_dim_multiplier=None, multiple_of=14336, rope_theta=1e6,
                                 num_experts=8, moe_top_k=2, moe_ffn_hidden=14336, moe_aux_loss_coeff=1e-3),
    # shaped like Qwen3-30B-A3B (Qwen3MoeForCausalLM's config): 128 experts of width 768, top 8
    # renormalised, 48 layers of width 2048 with 32 query heads of 128 (wider than the model)
    # and QK-norm
    "qwen3-30b-a3b": LLaMA3Config(block_size=32768, vocab_size=151936, n_layer=48, n_head=32, n_kv_head=4,
                                  n_embd=2048, ffn_dim_multiplier=None, multiple_of=6144, norm_eps=1e-6,
                                  rope_theta=1e6, head_size=128, qk_norm=True, num_experts=128, moe_top_k=8,
                                  moe_ffn_hidden=768, moe_aux_loss_coeff=1e-3),
    # DeepSeek-V3's MoE in a small model on the GPT-2 vocabulary: fine-grained experts (64 of
    # width 128, top 6), one shared expert, a sigmoid router balanced by its selection bias
    # (rate 1e-3) with a small sequence-wise auxiliary loss (1e-4); attention is LLaMA's GQA
    "deepseek-v3-small": replace(_SMALL, n_layer=6, n_embd=512, n_head=8, n_kv_head=4, num_experts=64,
                                 moe_top_k=6, moe_ffn_hidden=128, moe_shared_experts=1, moe_router="sigmoid",
                                 moe_bias_update_rate=1e-3, moe_aux_loss_coeff=1e-4),
}
