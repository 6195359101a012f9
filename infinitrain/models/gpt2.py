"""GPT-2: learned positions, pre-LayerNorm blocks, causal attention, GELU (tanh) MLP, and an
LM head tied to the token embedding. The vocabulary is padded to a multiple of 128 as in
llm.c; the padded rows never enter the softmax. Reads and writes llm.c GPT-2 checkpoints."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np

from ..autograd import no_grad
from ..autograd.recompute import checkpoint
from ..nn import functional as F
from ..nn import init
from ..nn.module import Module
from ..nn.modules import Embedding, LayerNorm, Linear, ModuleDict
from ..nn.parallel import tensor_parallel as tpl
from ..nn.parallel.tensor_parallel import TensorParallel
from ..ops import layers as ops_layers
from .base import Blocks, CausalLM, causal_attention
from ..io import DataFormatError, atomic_write, input_file

LLMC_GPT2_MAGIC = 20240326
LLMC_VERSIONS = {3: np.float32, 5: ml_dtypes.bfloat16}


@dataclass(frozen=True)
class GPT2Config:
    block_size: int = 1024
    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768

    @property
    def padded_vocab_size(self) -> int:
        return (self.vocab_size + 127) // 128 * 128


PRESETS = {
    "gpt2": GPT2Config(n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": GPT2Config(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": GPT2Config(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": GPT2Config(n_layer=48, n_head=25, n_embd=1600),
    "small": GPT2Config(n_layer=4, n_head=4, n_embd=256),   # quick runs, benchmarks
    "tiny": GPT2Config(n_layer=2, n_head=2, n_embd=64, block_size=256),  # tests
}
for _depth, _name in ((12, "gpt2"), (24, "gpt2-medium"), (36, "gpt2-large"), (48, "gpt2-xl")):
    PRESETS[f"d{_depth}"] = PRESETS[_name]


class CausalSelfAttention(Module):
    """Under TP each rank holds n_head/TP heads: its rows of q, k and v (c_attn column-parallel,
    split block by block) and the matching columns of c_proj (row-parallel)."""

    def __init__(self, cfg: GPT2Config, tp: TensorParallel | None = None, cp=None):
        super().__init__()
        self.cp = cp  # context parallelism: attention over the whole sequence
        C = cfg.n_embd
        if C % cfg.n_head:
            raise ValueError(f"n_embd ({C}) must be a multiple of n_head ({cfg.n_head})")
        self.n_head = tp.check_divisible("n_head", cfg.n_head) if tp else cfg.n_head
        self.c_attn = tpl.column_linear(C, 3 * C, tp, blocks=(C, C, C))
        self.c_proj = tpl.row_linear(C, C, tp)

    def forward(self, x):
        qkv = self.c_attn(x)  # [B, T, 3C/TP]: under SP, T is the whole sequence again
        B, T, _ = qkv.shape
        q, k, v = ops_layers.split_heads(qkv, self.n_head)
        y = causal_attention(q, k, v, self.cp)  # [B, H, T, D]: the model's attention (over the whole sequence under CP)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(Module):
    def __init__(self, cfg: GPT2Config, tp: TensorParallel | None = None):
        super().__init__()
        if tp:
            tp.check_divisible("the MLP width 4 * n_embd", 4 * cfg.n_embd)
        self.c_fc = tpl.column_linear(cfg.n_embd, 4 * cfg.n_embd, tp)
        self.c_proj = tpl.row_linear(4 * cfg.n_embd, cfg.n_embd, tp)

    recompute = False  # selective recomputation: GELU and the down projection rerun in backward

    def forward(self, x):
        h = self.c_fc(x)
        return checkpoint(self.down, h) if self.recompute else self.down(h)

    def down(self, h):
        return self.c_proj(F.gelu(h, approximate="tanh"))


class Block(Module):
    def __init__(self, cfg: GPT2Config, tp: TensorParallel | None = None, cp=None):
        super().__init__()
        self.ln_1 = LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg, tp, cp)
        self.ln_2 = LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg, tp)
        tpl.mark_sequence_parallel(self.ln_1, tp)
        tpl.mark_sequence_parallel(self.ln_2, tp)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(CausalLM):
    """tp: build the model tensor-parallel over tp.group (each rank holds its shard of every
    layer; the same model as one process, see nn.parallel.tensor_parallel). pp: build this
    pipeline stage's part (see CausalLM); the last stage holds a copy of the token embedding as
    its output head, kept equal to the first stage's by summing their gradients."""
    config_class = GPT2Config
    ties_embedding = True

    def __init__(self, config: GPT2Config, seed: int | None = None, tp: TensorParallel | None = None,
                 pp=None, cp=None):
        super().__init__()
        self.config = config
        layers = self._setup_parallel(tp, pp, cp)
        with init.deferred():  # every weight is drawn by _init_weights, in one process's order
            tp = self.tp
            Vp, C = config.padded_vocab_size, config.n_embd
            if tp:
                tp.check_divisible("the padded vocabulary", Vp)
            parts = {}
            if self.has_embedding:
                parts["wte"] = tpl.VocabParallelEmbedding(Vp, C, tp) if tp else Embedding(Vp, C)
                parts["wpe"] = Embedding(config.block_size, C)
                # under SP each rank adds the positions of its part of the sequence: wpe's gradient,
                # like the norms', is summed over TP after backward
                tpl.mark_sequence_parallel(parts["wpe"], tp)
            parts["h"] = Blocks({i: Block(config, tp, self.cp) for i in layers})
            if self.has_head:
                parts["ln_f"] = LayerNorm(C)
                tpl.mark_sequence_parallel(parts["ln_f"], tp)
            self.transformer = ModuleDict(parts)
            if self.has_head:
                self.lm_head = tpl.ColumnParallelLinear(C, Vp, tp, bias=False) if tp else Linear(C, Vp, bias=False)
                if self.has_embedding:
                    self.lm_head.weight = self.transformer.wte.weight  # tied (the same rows on each rank)
                else:
                    self.lm_head.weight.tied_copy_of = "transformer.wte.weight"
        self._init_weights(seed)

    def _embedding_weight(self):
        """The token embedding on this rank: its own, the last stage's copy, or None."""
        if self.has_embedding:
            return self.transformer.wte.weight
        return self.lm_head.weight if self.has_head else None

    def tied_parameters(self) -> list:
        w = self._embedding_weight()
        # held twice only when this stage has one end of the model (in a V stage 0 has both)
        return [w] if self.pp is not None and self.has_embedding != self.has_head else []

    @no_grad()
    def _init_weights(self, seed):
        """GPT-2's init as in llm.c's reference: N(0, 0.02) for weights and embeddings, zero
        biases, residual projections scaled by 1/sqrt(2 * n_layer); padded vocab rows zero.
        Drawn in one process's order whatever this rank holds."""
        from ..random import Generator, default_generator
        gen = Generator(seed) if seed is not None else default_generator
        cfg, std = self.config, 0.02
        linears = (Linear, tpl.ColumnParallelLinear, tpl.RowParallelLinear)
        wte = self._embedding_weight()
        self._draw(gen, wte, cfg.padded_vocab_size * cfg.n_embd, std)
        self._draw(gen, self.transformer.wpe.weight if self.has_embedding else None,
                   cfg.block_size * cfg.n_embd, std)
        h = self.transformer.h
        for i in range(cfg.n_layer):
            if i not in h:
                gen.advance(12 * cfg.n_embd * cfg.n_embd)  # c_attn, attn.c_proj, c_fc, mlp.c_proj
                continue
            for name, m in h[i].named_modules():
                if isinstance(m, linears):
                    s = std / math.sqrt(2 * cfg.n_layer) if name.endswith("c_proj") else std
                    init.normal_(m.weight, 0.0, s, generator=gen)
                    if m.bias is not None:
                        init.zeros_(m.bias)
        if wte is not None:
            start = self.tp.rank * (wte.shape[0]) if self.tp else 0
            first_padded = cfg.vocab_size - start
            wte[min(max(first_padded, 0), wte.shape[0]):] = 0.0

    def embed(self, idx):
        # this rank's part of the sequence (CP chunks, SP part), from here to the head
        pos = self.token_positions(idx.shape[1], idx.device)
        return self.transformer.wte(self.local_tokens(idx)) + self.transformer.wpe(pos)

    # ---- llm.c checkpoints -------------------------------------------------------------
    _PER_LAYER = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                  "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                  "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]

    @classmethod
    def _llmc_shapes(cls, cfg: GPT2Config) -> list:
        C, L = cfg.n_embd, cfg.n_layer
        per_layer = [(C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,), (4 * C, C),
                     (4 * C,), (C, 4 * C), (C,)]
        return ([("wte", (cfg.padded_vocab_size, C), 1), ("wpe", (cfg.block_size, C), 1)]
                + [(n, shape, L) for n, shape in zip(cls._PER_LAYER, per_layer)]
                + [("ln_f.weight", (C,), 1), ("ln_f.bias", (C,), 1)])

    def _llmc_params(self) -> dict:
        t = self.transformer
        out = {"wte": [self._embedding_weight()],
               "wpe": [t.wpe.weight if self.has_embedding else None]}
        out.update({n: self._layer_params(n) for n in self._PER_LAYER})
        out["ln_f.weight"] = [t.ln_f.weight if self.has_head else None]
        out["ln_f.bias"] = [t.ln_f.bias if self.has_head else None]
        return out

    @classmethod
    def from_llmc(cls, path, dtype=None, tp: TensorParallel | None = None, pp=None, cp=None) -> "GPT2":
        """Loads an llm.c GPT-2 checkpoint (version 3 float32 or 5 bfloat16); under TP each rank
        keeps its slice of every tensor, under PP its stage's layers."""
        cfg, store = cls._llmc_header(path)
        model = cls(cfg, seed=0, tp=tp, pp=pp, cp=cp)
        model._llmc_load_payload(np.memmap(path, dtype=store.newbyteorder("<") if store.kind == "f"
                                           else store, mode="r", offset=1024))
        return model.to(dtype) if dtype is not None else model

    @classmethod
    def config_from_llmc(cls, path) -> GPT2Config:
        """The model an llm.c GPT-2 checkpoint holds, read from its header (the file's size checked
        against it) without reading the weights."""
        return cls._llmc_header(path)[0]

    @classmethod
    def _llmc_header(cls, path) -> tuple:
        path = input_file(path, "checkpoint")
        size = path.stat().st_size
        if size < 1024:
            raise DataFormatError(f"{path}: {size} bytes is shorter than the llm.c header")
        header = np.fromfile(path, dtype="<i4", count=256)
        if int(header[0]) != LLMC_GPT2_MAGIC:
            raise DataFormatError(f"{path}: magic number {int(header[0])} is not an llm.c GPT-2 "
                                  f"checkpoint's ({LLMC_GPT2_MAGIC})")
        version = int(header[1])
        if version not in LLMC_VERSIONS:
            raise DataFormatError(f"{path}: checkpoint version {version} is not supported "
                                  "(3 = float32, 5 = bfloat16)")
        maxT, V, L, H, C, Vp = (int(x) for x in header[2:8])
        if min(maxT, V, L, H, C, Vp) < 1:
            raise DataFormatError(f"{path}: header sizes (block size, vocabulary, layers, heads, width, "
                                  f"padded vocabulary) must be positive, got {[maxT, V, L, H, C, Vp]}")
        cfg = GPT2Config(block_size=maxT, vocab_size=V, n_layer=L, n_head=H, n_embd=C)
        if Vp != cfg.padded_vocab_size:
            raise DataFormatError(f"{path}: padded vocabulary {Vp} is not {V} rounded up to 128")
        store = np.dtype(LLMC_VERSIONS[version])
        expected = 1024 + cls._llmc_numel(cfg) * store.itemsize
        if size != expected:  # checked before the model is built: a header cannot eat the memory
            what = "truncated" if size < expected else "trailing data"
            raise DataFormatError(f"{path}: {size} bytes, but a {L}-layer, {C}-wide model in "
                                  f"version {version} needs {expected} ({what})")
        return cfg, store

    def save_llmc(self, path, version: int = 3) -> None:
        """Writes an llm.c checkpoint: version 3 (float32) or 5 (bfloat16), atomically."""
        if version not in LLMC_VERSIONS:
            raise ValueError(f"llm.c checkpoint version must be 3 (float32) or 5 (bfloat16), not {version}")
        c = self.config
        header = np.zeros(256, dtype="<i4")
        header[:8] = (LLMC_GPT2_MAGIC, version, c.block_size, c.vocab_size, c.n_layer, c.n_head,
                      c.n_embd, c.padded_vocab_size)
        atomic_write(path, header.tobytes() + self._llmc_payload(LLMC_VERSIONS[version]))


def gpt2(name: str = "gpt2", tp: TensorParallel | None = None, pp=None, cp=None, **overrides) -> GPT2:
    if name not in PRESETS:
        raise ValueError(f"unknown GPT-2 preset {name!r}; choose from {', '.join(PRESETS)}")
    return GPT2(replace(PRESETS[name], **overrides), tp=tp, pp=pp, cp=cp)
