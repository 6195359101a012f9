"""LLaMA-3: RMSNorm, rotary embeddings (rope_theta, LLaMA-3.1 scaling), grouped-query attention,
SwiGLU MLP sized by ffn_dim_multiplier/multiple_of, untied LM head. Reads and writes
InfiniTrain's llm.c-style LLaMA-3 checkpoints (magic 20240803)."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .. import creation
from ..autograd import no_grad
from ..autograd.recompute import checkpoint
from ..nn import functional as F
from ..nn import init
from ..nn.module import Module
from ..nn.modules import Embedding, Linear, ModuleDict, RMSNorm
from ..nn.parallel import tensor_parallel as tpl
from ..nn.parallel.tensor_parallel import TensorParallel
from ..ops import layers as ops_layers
from ..ops.index import index_select
from ..nn.moe import MoE, update_moe_biases
from .base import Blocks, CausalLM, causal_attention
from .llama3_config import PRESETS, LLaMA3Config  # noqa: F401  (this module's names)
from ..io import DataFormatError, atomic_write, input_file

LLMC_LLAMA3_MAGIC = 20240803
LLMC_LLAMA3_VERSION = 3  # float32


def rope_frequencies(cfg: LLaMA3Config) -> np.ndarray:
    """Inverse frequencies of the rotary pairs, with LLaMA-3.1's long-context scaling: low
    frequencies divided by the factor, high ones kept, a smooth blend in between."""
    D = cfg.head_dim
    inv = 1.0 / cfg.rope_theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    if not cfg.use_scaled_rope:
        return inv
    factor, low_ff, high_ff, old_len = cfg.rope_scaling_factor, 1.0, 4.0, 8192.0
    wavelen = 2 * math.pi / inv
    smooth = (old_len / wavelen - low_ff) / (high_ff - low_ff)
    scaled = np.where(wavelen > old_len / low_ff, inv / factor, inv)
    middle = (wavelen <= old_len / low_ff) & (wavelen >= old_len / high_ff)
    return np.where(middle, (1 - smooth) * inv / factor + smooth * inv, scaled)


class Attention(Module):
    """Under TP each rank holds n_head/TP query heads and n_kv_head/TP key/value heads (both
    must divide: KV heads are split, never replicated)."""

    def __init__(self, cfg: LLaMA3Config, tp: TensorParallel | None = None, cp=None):
        super().__init__()
        self.cp = cp  # context parallelism: attention over the whole sequence
        D = cfg.head_dim
        self.n_head = tp.check_divisible("n_head", cfg.n_head) if tp else cfg.n_head
        self.n_kv_head = tp.check_divisible("n_kv_head (grouped-query KV heads are split, not "
                                            "replicated)", cfg.n_kv_head) if tp else cfg.n_kv_head
        q, kv = cfg.n_head * D, cfg.n_kv_head * D
        self.c_attn = tpl.column_linear(cfg.n_embd, q + 2 * kv, tp, bias=False, blocks=(q, kv, kv))
        self.c_proj = tpl.row_linear(q, cfg.n_embd, tp, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(D, eps=cfg.norm_eps)
            self.k_norm = RMSNorm(D, eps=cfg.norm_eps)
            if tp is not None:  # whole on every TP rank, each rank's heads add to their gradients
                for p in (self.q_norm.weight, self.k_norm.weight):
                    p.partial_grad_group = tp.group
        self.qk_norm = cfg.qk_norm

    def forward(self, x, cos, sin):
        qkv = self.c_attn(x)  # [B, T, (H + 2 KV) D / TP]: under SP, T is the whole sequence again
        B, T, _ = qkv.shape
        q, k, v = ops_layers.split_heads(qkv, self.n_head, self.n_kv_head)  # [B, h, T, D]
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        # the rotary kernel reads [B, T, H, D]; [B, H, T, D] is the same with batch B*H and H = 1
        q = F.rotary_embedding(q.reshape(B * self.n_head, T, 1, -1), cos, sin).reshape(q.shape)
        k = F.rotary_embedding(k.reshape(B * self.n_kv_head, T, 1, -1), cos, sin).reshape(k.shape)
        y = causal_attention(q, k, v, self.cp)  # the model's attention (over the whole sequence under CP)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(Module):
    def __init__(self, cfg: LLaMA3Config, tp: TensorParallel | None = None):
        super().__init__()
        if tp:
            tp.check_divisible("the MLP width (ffn_hidden)", cfg.ffn_hidden)
        self.c_fc = tpl.column_linear(cfg.n_embd, cfg.ffn_hidden, tp, bias=False)    # up
        self.c_fc2 = tpl.column_linear(cfg.n_embd, cfg.ffn_hidden, tp, bias=False)   # gate (silu)
        self.c_proj = tpl.row_linear(cfg.ffn_hidden, cfg.n_embd, tp, bias=False)

    recompute = False  # selective recomputation: the activation and down projection rerun in backward

    def forward(self, x):
        gate, up = self.c_fc2(x), self.c_fc(x)
        return checkpoint(self.down, gate, up) if self.recompute else self.down(gate, up)

    def down(self, gate, up):
        return self.c_proj(F.swiglu(gate, up))


class Block(Module):
    """moe: this layer's feed-forward is a mixture of experts (nn.moe.MoE over ep) instead of
    the dense MLP."""

    def __init__(self, cfg: LLaMA3Config, tp: TensorParallel | None = None, cp=None, moe: bool = False, ep=None):
        super().__init__()
        self.ln_1 = RMSNorm(cfg.n_embd, eps=cfg.norm_eps)
        self.attn = Attention(cfg, tp, cp)
        self.ln_2 = RMSNorm(cfg.n_embd, eps=cfg.norm_eps)
        self.mlp = MoE(cfg, tp, ep, cp) if moe else MLP(cfg, tp)
        tpl.mark_sequence_parallel(self.ln_1, tp)
        tpl.mark_sequence_parallel(self.ln_2, tp)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.ln_1(x), cos, sin)
        return x + self.mlp(self.ln_2(x))


class LLaMA3(CausalLM):
    """tp: build the model tensor-parallel over tp.group. The vocabulary is padded to a multiple
    of TP there (zero rows the loss never sees); files keep the true vocabulary. pp: build this
    pipeline stage's part (see CausalLM). ep: an ExpertParallel for the MoE layers (each rank
    builds its share of the experts), or None (every expert here)."""
    config_class = LLaMA3Config

    def __init__(self, config: LLaMA3Config, seed: int | None = None, tp: TensorParallel | None = None,
                 pp=None, cp=None, ep=None):
        super().__init__()
        config.validate()
        self.config = config
        layers = self._setup_parallel(tp, pp, cp)
        with init.deferred():  # every weight is drawn by _init_weights, in one process's order
            tp = self.tp
            C, V = config.n_embd, config.vocab_size
            parts = {}
            if self.has_embedding:
                parts["wte"] = tpl.VocabParallelEmbedding(V, C, tp) if tp else Embedding(V, C)
            parts["h"] = Blocks({i: Block(config, tp, self.cp, config.is_moe_layer(i), ep) for i in layers})
            if self.has_head:
                parts["ln_f"] = RMSNorm(C, eps=config.norm_eps)
                tpl.mark_sequence_parallel(parts["ln_f"], tp)
            self.transformer = ModuleDict(parts)
            if self.has_head:
                self.lm_head = tpl.ColumnParallelLinear(C, V, tp, bias=False, pad=True) if tp \
                    else Linear(C, V, bias=False)
        # rotary tables for the positions in use (grown on demand up to block_size: a header's
        # block_size of 2^26 must not allocate gigabytes before any sequence is that long)
        self._rope_tables(min(config.block_size, 2048))
        self._init_weights(seed)

    def _rope_tables(self, T: int) -> None:
        angles = np.outer(np.arange(T), rope_frequencies(self.config))
        device = self.rope_cos.device if "rope_cos" in self._buffers else "cpu"  # grown where it lives
        self.register_buffer("rope_cos", creation.from_numpy(np.cos(angles).astype(np.float32)).to(device=device),
                             persistent=False)
        self.register_buffer("rope_sin", creation.from_numpy(np.sin(angles).astype(np.float32)).to(device=device),
                             persistent=False)

    def rope(self, T: int) -> tuple:
        """(cos, sin) [T, head_dim / 2] of the first T positions, float32."""
        if T > self.rope_cos.shape[0]:
            self._rope_tables(min(self.config.block_size, max(T, 2 * self.rope_cos.shape[0])))
        return self.rope_cos[:T], self.rope_sin[:T]

    @no_grad()
    def _init_weights(self, seed):
        """N(0, 0.02) weights, residual projections scaled by 1/sqrt(2 * n_layer), drawn in one
        process's order whatever this rank holds."""
        from ..random import Generator, default_generator
        gen = Generator(seed) if seed is not None else default_generator
        cfg, std = self.config, 0.02
        C = cfg.n_embd
        kinds = (Linear, tpl.ColumnParallelLinear, tpl.RowParallelLinear)
        self._draw(gen, self.transformer.wte.weight if self.has_embedding else None,
                   cfg.vocab_size * C, std)
        h, out_std = self.transformer.h, std / math.sqrt(2 * cfg.n_layer)
        for i in range(cfg.n_layer):
            if i not in h:
                gen.advance(self._block_numel(i))
                continue
            dense = [h[i].attn] + ([h[i].mlp] if isinstance(h[i].mlp, MLP) else [])
            for m in (m for part in dense for m in part.modules() if isinstance(m, kinds)):
                # drawn full-size under TP; the residual projections (c_proj) scaled
                init.normal_(m.weight, 0.0, out_std if m in (part.c_proj for part in dense) else std, generator=gen)
            if isinstance(h[i].mlp, MoE):
                self._draw_moe(gen, h[i].mlp, std, out_std)
        self._draw(gen, self.lm_head.weight if self.has_head else None, cfg.vocab_size * C, std)

    def _block_numel(self, i: int) -> int:
        """Layer i's drawn numbers (its matrices; norms start at one)."""
        cfg = self.config
        C, D = cfg.n_embd, cfg.head_dim
        attn = (2 * cfg.n_head + 2 * cfg.n_kv_head) * D * C  # q, k, v and the output projection
        if not cfg.is_moe_layer(i):
            return attn + 3 * cfg.ffn_hidden * C
        E, F = cfg.num_experts, cfg.expert_ffn_hidden
        return attn + E * C + 3 * E * F * C + 3 * cfg.moe_shared_experts * F * C

    def _draw_moe(self, gen, moe, std, out_std) -> None:
        """The router, then every expert in global order (another expert-parallel rank's drawn
        past), then the shared experts: the draws of one process."""
        cfg = self.config
        C, F = cfg.n_embd, cfg.expert_ffn_hidden
        self._draw(gen, moe.gate.weight, cfg.num_experts * C, std)
        for e in range(cfg.num_experts):
            expert = moe.experts[str(e)] if str(e) in moe.experts else None
            for proj in ("gate_proj", "up_proj", "down_proj"):
                self._draw(gen, getattr(expert, proj).weight if expert is not None else None, F * C,
                           out_std if proj == "down_proj" else std)
        if "shared_experts" in moe._modules:
            for proj in ("gate_proj", "up_proj", "down_proj"):
                init.normal_(getattr(moe.shared_experts, proj).weight, 0.0,
                             out_std if proj == "down_proj" else std, generator=gen)

    # ---- mixture of experts -------------------------------------------------------------------
    def moe_layers(self) -> dict:
        """Layer index -> the MoE feed-forward of each of this rank's blocks that has experts."""
        return {i: b.mlp for i, b in zip(self.transformer.h.indices(), self.transformer.h) if isinstance(b.mlp, MoE)}

    def update_moe_biases(self, reduce=None):
        """After each optimizer step: the step's loads summed over the ranks (`reduce` sums a
        host array over the data-parallel ranks, DP x CP; None on one), DeepSeek-V3's selection
        biases updated from them, the records cleared. Returns the step's nn.moe.MoEStepStats
        (tokens per expert, auxiliary losses, imbalance) for the log."""
        return update_moe_biases(self.moe_layers(), reduce)

    @classmethod
    def parameter_parts(cls, config, ep: int = 1) -> tuple:
        """As CausalLM's, a block being the mean of the model's (an MoE block holds 1/ep of the
        experts)."""
        first, block, last = super().parameter_parts(config)
        if not config.num_experts:
            return first, block, last
        dense_mlp = 3 * config.ffn_hidden * config.n_embd
        blocks = [block - dense_mlp + (cls._moe_numel(config, ep) if config.is_moe_layer(i) else dense_mlp)
                  for i in range(config.n_layer)]
        return first, int(np.mean(blocks)), last

    @classmethod
    def active_parameters(cls, config) -> int:
        """As CausalLM's, an MoE layer counting its router and the experts a token goes through."""
        if not config.num_experts:
            return super().active_parameters(config)
        first, block, last = super().parameter_parts(config)
        C, F, dense_mlp = config.n_embd, config.expert_ffn_hidden, 3 * config.ffn_hidden * config.n_embd
        active = config.num_experts * C + 3 * (config.moe_top_k + config.moe_shared_experts) * F * C
        return first + last + sum(block - dense_mlp + (active if config.is_moe_layer(i) else dense_mlp)
                                  for i in range(config.n_layer))

    @staticmethod
    def _moe_numel(config, ep: int = 1) -> int:
        """An MoE feed-forward's parameters on a rank: router, its experts (E / ep), shared experts."""
        E, C, F = config.num_experts, config.n_embd, config.expert_ffn_hidden
        return E * C + 3 * (E // ep + config.moe_shared_experts) * F * C

    @classmethod
    def head_work(cls, config) -> float:
        """As CausalLM's, with an MoE layer's work its active experts' (and router's)."""
        if not config.num_experts:
            return super().head_work(config)
        C, D, F = config.n_embd, config.head_dim, config.expert_ffn_hidden
        attn = (2 * config.n_head + 2 * config.n_kv_head) * D * C
        active = config.num_experts * C + 3 * (config.moe_top_k + config.moe_shared_experts) * F * C
        block = np.mean([attn + (active if config.is_moe_layer(i) else 3 * config.ffn_hidden * C)
                         for i in range(config.n_layer)])
        return config.vocab_size * C / block

    def to(self, *args, **kwargs) -> "LLaMA3":
        cos, sin = self.rope_cos, self.rope_sin
        super().to(*args, **kwargs)
        device = self.rope_cos.device  # the tables follow the model's device, but stay float32
        self._buffers["rope_cos"], self._buffers["rope_sin"] = cos.to(device=device), sin.to(device=device)
        return self

    def embed(self, idx):
        return self.transformer.wte(self.local_tokens(idx))  # [B, T/CP/TP, C] under CP and SP

    def block_inputs(self, T: int) -> tuple:
        cos, sin = self.rope(T)
        if self.cp is not None:  # the angles of this rank's tokens' places in the whole sequence
            pos = self.cp.positions(T, cos.device)
            cos, sin = index_select(cos, 0, pos), index_select(sin, 0, pos)
        return cos, sin

    # ---- checkpoints ---------------------------------------------------------------------
    _PER_LAYER = ["ln_1.weight", "attn.c_attn.weight", "attn.c_proj.weight", "ln_2.weight",
                  "mlp.c_fc.weight", "mlp.c_fc2.weight", "mlp.c_proj.weight"]

    @classmethod
    def _llmc_shapes(cls, cfg: LLaMA3Config) -> list:
        C, L, F = cfg.n_embd, cfg.n_layer, cfg.ffn_hidden
        qkv = (cfg.n_head + 2 * cfg.n_kv_head) * cfg.head_dim
        per_layer = [(C,), (qkv, C), (C, cfg.n_head * cfg.head_dim), (C,), (F, C), (F, C), (C, F)]
        return ([("wte", (cfg.vocab_size, C), 1)]
                + [(n, shape, L) for n, shape in zip(cls._PER_LAYER, per_layer)]
                + [("ln_f.weight", (C,), 1), ("lm_head", (cfg.vocab_size, C), 1)])

    def _llmc_params(self) -> dict:
        out = {"wte": [self.transformer.wte.weight if self.has_embedding else None]}
        out.update({n: self._layer_params(n) for n in self._PER_LAYER})
        out["ln_f.weight"] = [self.transformer.ln_f.weight if self.has_head else None]
        out["lm_head"] = [self.lm_head.weight if self.has_head else None]
        return out

    def save_llmc(self, path) -> None:
        c = self.config
        if c.head_size is not None or c.qk_norm:
            raise ValueError("llm.c's LLaMA-3 checkpoint format has no head_size or QK-norm (Qwen3's); save this "
                             "model with save_pretrained or the trainer's checkpoints (--save)")
        if c.num_experts:
            raise ValueError(f"the llm.c LLaMA-3 format has no experts: this model has {c.num_experts} per MoE "
                             "layer; save it with save_checkpoint (or save_pretrained) instead")
        header = np.zeros(256, dtype="<i4")
        ints = [LLMC_LLAMA3_MAGIC, LLMC_LLAMA3_VERSION, c.block_size, c.vocab_size, c.n_layer,
                c.n_head, c.n_kv_head, c.n_embd]
        header[:8] = ints
        floats = header.view("<f4")
        floats[8] = c.ffn_dim_multiplier or 0.0
        header[9] = c.multiple_of
        floats[10], floats[11] = c.norm_eps, c.rope_theta
        header[12], header[13], header[14], header[15] = int(c.use_scaled_rope), 4, 3, 1
        floats[16] = c.rope_scaling_factor  # ours: not read by loaders that stop at field 15
        atomic_write(path, header.tobytes() + self._llmc_payload("<f4"))

    @classmethod
    def from_llmc(cls, path, tp: TensorParallel | None = None, pp=None, cp=None) -> "LLaMA3":
        model = cls(cls.config_from_llmc(path), seed=0, tp=tp, pp=pp, cp=cp)
        model._llmc_load_payload(np.memmap(path, dtype="<f4", mode="r", offset=1024))
        return model

    @classmethod
    def config_from_llmc(cls, path) -> LLaMA3Config:
        """The model an llm.c LLaMA-3 checkpoint holds, read from its header (the file's size
        checked against it) without reading the weights."""
        path = input_file(path, "checkpoint")
        size = path.stat().st_size
        if size < 1024:
            raise DataFormatError(f"{path}: {size} bytes is shorter than the llm.c header")
        header = np.fromfile(path, dtype="<i4", count=256)
        floats = header.view("<f4")
        if int(header[0]) != LLMC_LLAMA3_MAGIC:
            raise DataFormatError(f"{path}: magic number {int(header[0])} is not an llm.c LLaMA-3 "
                                  f"checkpoint's ({LLMC_LLAMA3_MAGIC})")
        if int(header[1]) != LLMC_LLAMA3_VERSION:
            raise DataFormatError(f"{path}: version {int(header[1])} is not supported (3 = float32)")
        # float32 fields, read back as the shortest decimal that round-trips (1.3, not 1.2999999523)
        ffn_mult, norm_eps, theta = (float(str(floats[i])) for i in (8, 10, 11))
        suspicious = {name: v for name, v in (("ffn_dim_multiplier", ffn_mult),
                      ("norm_eps", norm_eps), ("rope_theta", theta))
                      if (v != 0 and abs(v) < 1.2e-38) or (name != "ffn_dim_multiplier" and v == 0)}
        if suspicious:
            slots = [8 if k == "ffn_dim_multiplier" else 10 if k == "norm_eps" else 11 for k in suspicious]
            detail = ", ".join(f"{k} reads {v:.3g} (integer {int(header[i])})" for (k, v), i in
                               zip(suspicious.items(), slots))
            raise DataFormatError(
                f"{path}: the header's float fields hold integers ({detail}): this file was written "
                "with its floats truncated to int (as llm.c's train_llama3.py does), so the model "
                "it describes is wrong; rewrite the header with the fields as float32 bits")
        scaling = float(str(floats[16])) if floats[16] > 0 else 8.0
        sizes = [int(header[i]) for i in (2, 3, 4, 5, 6, 7, 9)]
        if min(sizes) < 1:
            raise DataFormatError(f"{path}: header sizes (block size, vocabulary, layers, heads, KV heads, "
                                  f"width, multiple_of) must be positive, got {sizes}")
        cfg = LLaMA3Config(block_size=int(header[2]), vocab_size=int(header[3]), n_layer=int(header[4]),
                           n_head=int(header[5]), n_kv_head=int(header[6]), n_embd=int(header[7]),
                           ffn_dim_multiplier=ffn_mult or None, multiple_of=int(header[9]),
                           norm_eps=norm_eps, rope_theta=theta, use_scaled_rope=bool(header[12]),
                           rope_scaling_factor=scaling)
        try:
            cfg.validate()
        except ValueError as e:
            raise DataFormatError(f"{path}: the header describes no valid model: {e}") from None
        expected = 1024 + 4 * cls._llmc_numel(cfg)
        if size != expected:  # checked before the model is built: a header cannot eat the memory
            raise DataFormatError(f"{path}: {size} bytes, but the model in its header needs {expected} "
                                  f"({'truncated' if size < expected else 'trailing data'})")
        return cfg


def llama3(name: str = "small", tp: TensorParallel | None = None, pp=None, cp=None, ep=None,
           **overrides) -> LLaMA3:
    if name not in PRESETS:
        raise ValueError(f"unknown LLaMA-3 preset {name!r}; choose from {', '.join(PRESETS)}")
    return LLaMA3(replace(PRESETS[name], **overrides), tp=tp, pp=pp, cp=cp, ep=ep)
