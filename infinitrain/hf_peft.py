"""LoRA adapters in Hugging Face PEFT's format, both ways: adapter_config.json (peft_type
"LORA") and adapter_model.safetensors with tensors named
`base_model.model.<transformers module>.lora_A.weight` [r, in] and `.lora_B.weight` [out, r],
the names and layouts of the transformers models infinitrain.hf writes, so that
`peft.PeftModel.from_pretrained(base, folder)` applies what save_lora writes, and load_lora
reads what PEFT writes.

What is converted (besides the module names):
- GPT-2: transformers' c_attn, c_proj and c_fc are Conv1D ([in, out] weights), which PEFT
  adapts with fan_in_fan_out; its A and B keep nn.Linear's shapes, so ours pass unchanged.
- LLaMA: our fused c_attn is q_proj, k_proj and v_proj there. A fused adapter (A [r, C],
  B [q+k+v rows, r]) is exactly three adapters that share A, each with its rows of B (q's and
  k's rows in transformers' rotary order, as hf.py permutes the weights). Three adapters with
  different A's (PEFT's own, or only some of q, k, v) become one fused adapter of the summed
  rank: A stacked, B block-diagonal, exact too.
- A layer whose rank or scale is not the config's (PEFT's rank_pattern / alpha_pattern, or
  such a fused adapter) keeps its rank and has its scale folded into B, so every layer of a
  model scales by alpha / r.
"""
from __future__ import annotations

import math
import re

import numpy as np

from .hf import expected_shapes
from .hf_llama import _rope_to_halves, _rope_to_pairs

PREFIX = "base_model.model."
# ours -> transformers for the layers of a block (LLaMA's c_attn: q, k and v, handled apart)
_LLAMA = {"attn.c_proj": "self_attn.o_proj", "mlp.c_fc": "mlp.up_proj", "mlp.c_fc2": "mlp.gate_proj",
          "mlp.c_proj": "mlp.down_proj"}
_QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")


class PeftFormatError(ValueError):
    """Adapters that are not what this module converts (checkpoint turns it into CheckpointError)."""


def _block_names(kind: str) -> dict:
    if kind == "GPT2":
        return {n: (n,) for n in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
    return {"attn.c_attn": _QKV, **{k: (v,) for k, v in _LLAMA.items()}}


def theirs_of(kind: str, ours: str) -> tuple:
    """The transformers modules of one of our linear layers (three for LLaMA's c_attn)."""
    m = re.fullmatch(r"transformer\.h\.(\d+)\.(.+)", ours)
    names = _block_names(kind)
    if kind not in ("GPT2", "LLaMA3") or not m or m.group(2) not in names:
        raise PeftFormatError(f"{ours} has no counterpart in PEFT's format for {kind} (adapters are converted on "
                              f"the blocks' projections: {', '.join(names)})")
    base = f"transformer.h.{m.group(1)}." if kind == "GPT2" else f"model.layers.{m.group(1)}."
    return tuple(base + t for t in names[m.group(2)])


def ours_of(kind: str, theirs: str) -> str:
    """Our layer for a transformers module PEFT adapted."""
    gpt2 = kind == "GPT2"
    m = re.fullmatch(r"transformer\.h\.(\d+)\.(.+)" if gpt2 else r"model\.layers\.(\d+)\.(.+)", theirs)
    back = {t: o for o, ts in _block_names(kind).items() for t in ts}
    if not m or m.group(2) not in back:
        raise PeftFormatError(f"PEFT adapts {theirs}, which infinitrain's {kind} cannot adapt (it converts adapters on "
                              f"{', '.join(sorted(back))} of every block)")
    return f"transformer.h.{m.group(1)}.{back[m.group(2)]}"


def _target_modules(kind: str, cfg, adapted_theirs: set) -> list:
    """PEFT's target_modules for these modules: the short names (e.g. "q_proj") where they pick
    exactly these modules of the whole model, else the modules' full names."""
    linear = [n[:-len(".weight")] for n, s in expected_shapes(_Cls(kind), cfg, True).items()
              if len(s) == 2 and n.startswith(("transformer.h.", "model.layers."))]
    for depth in (1, 2):
        short = {".".join(t.split(".")[-depth:]) for t in adapted_theirs}
        picked = {n for n in linear if any(n == s or n.endswith("." + s) for s in short)}
        if picked == adapted_theirs:
            return sorted(short)
    return sorted(adapted_theirs)


class _Cls:
    """Stands for a model class in hf.expected_shapes, which asks only for its name."""

    def __init__(self, kind: str):
        self.__name__ = kind


def export(kind: str, cfg, lora: dict, ranks: dict, r: int, alpha: float, adapted: list,
           base_model: str | None) -> tuple:
    """(adapter_config.json as a dict, {PEFT tensor name: float32 array}) for adapters given as
    {our layer name: (A [R, in], B [out, R])} (one-process arrays, this stage's layers);
    `adapted` names every layer of the whole model that has adapters (for target_modules), and
    `ranks` those whose rank R is not r."""
    tensors, rank_pattern, alpha_pattern = {}, {}, {}
    H, KV = cfg.n_head, getattr(cfg, "n_kv_head", cfg.n_head)
    D = getattr(cfg, "head_dim", cfg.n_embd // H)
    for ours, (A, B) in lora.items():
        theirs = theirs_of(kind, ours)
        if len(theirs) == 3:  # LLaMA's fused q, k, v: one shared A, B split by rows
            q, k, v = np.split(B, [H * D, (H + KV) * D])
            parts = zip(theirs, (A, A, A), (_rope_to_halves(q, H), _rope_to_halves(k, KV), v))
        else:
            parts = [(theirs[0], A, B)]
        for name, a, b in parts:
            tensors[f"{PREFIX}{name}.lora_A.weight"] = np.ascontiguousarray(a, np.float32)
            tensors[f"{PREFIX}{name}.lora_B.weight"] = np.ascontiguousarray(b, np.float32)
    for ours, R in ranks.items():  # the scale stays alpha / r: alpha' / R = alpha / r
        for name in theirs_of(kind, ours):
            rank_pattern[name], alpha_pattern[name] = R, alpha * R / r
    adapted_theirs = {t for o in adapted for t in theirs_of(kind, o)}
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
              "r": r, "lora_alpha": alpha, "lora_dropout": 0.0, "bias": "none",
              "target_modules": _target_modules(kind, cfg, adapted_theirs),
              "fan_in_fan_out": kind == "GPT2", "rank_pattern": rank_pattern, "alpha_pattern": alpha_pattern,
              "use_rslora": False, "use_dora": False, "lora_bias": False, "modules_to_save": None,
              "init_lora_weights": True, "inference_mode": True}
    return config, tensors


def is_peft_config(config: dict) -> bool:
    return "peft_type" in config


def check_config(config: dict, where) -> None:
    """What infinitrain's LoRA can apply exactly: plain LoRA (no DoRA, no bias, no other
    trained modules)."""
    if config.get("peft_type") != "LORA":
        raise PeftFormatError(f"{where} holds {config.get('peft_type')!r} adapters; infinitrain loads LoRA's")
    unsupported = [f"{k}={config[k]!r}" for k, ok in (("use_dora", False), ("lora_bias", False), ("bias", "none"))
                   if config.get(k, ok) not in (ok, None)]
    if config.get("modules_to_save"):
        unsupported.append(f"modules_to_save={config['modules_to_save']!r}")
    if unsupported:
        raise PeftFormatError(f"{where}: {', '.join(unsupported)} is not plain LoRA, which is all infinitrain "
                              "applies (W + alpha/r B A on linear layers)")


def _scale(config: dict, module: str, rank: int) -> float:
    """PEFT's scale for one module: its alpha (alpha_pattern, matched as PEFT matches it: the
    key is the module's name or a dotted suffix of it, as a regular expression) over its rank
    (or over √rank with rsLoRA)."""
    alpha = config["lora_alpha"]
    for key, a in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            alpha = a
            break
    return alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)


def import_(kind: str, cfg, config: dict, theirs) -> tuple:
    """({our layer: (A [R, in], B [out, R])}, {our layer: R where R != r}) from PEFT tensors
    (theirs: {name: array}), every B scaled so that the layer's scale is lora_alpha / r."""
    r, target = config["r"], config["lora_alpha"] / config["r"]
    modules = {}
    for name in theirs:
        m = re.fullmatch(re.escape(PREFIX) + r"(.+)\.lora_([AB])(?:\.[^.]+)?\.weight", name)
        if not m:
            raise PeftFormatError(f"{name} is not a LoRA tensor of PEFT's format "
                                  f"({PREFIX}<module>.lora_A.weight / .lora_B.weight)")
        modules.setdefault(m.group(1), {})[m.group(2)] = name
    grouped = {}
    for module, ab in modules.items():
        if set(ab) != {"A", "B"}:
            raise PeftFormatError(f"{module} has lora_{'A' if 'A' in ab else 'B'} without its partner")
        A, B = (np.array(theirs[ab[x]], np.float32) for x in "AB")  # copies: the files are mapped read-only
        if A.ndim != 2 or B.ndim != 2 or B.shape[1] != A.shape[0]:
            raise PeftFormatError(f"{module}: lora_A {A.shape} and lora_B {B.shape} are not [r, in] and [out, r]")
        grouped.setdefault(ours_of(kind, module), {})[module] = (A, B * (_scale(config, module, A.shape[0]) / target))
    lora, ranks = {}, {}
    H, KV = cfg.n_head, getattr(cfg, "n_kv_head", cfg.n_head)
    D = getattr(cfg, "head_dim", cfg.n_embd // H)
    for ours, parts in grouped.items():
        names = theirs_of(kind, ours)
        if len(names) == 1:
            lora[ours] = parts[names[0]]
        else:
            lora[ours] = _fuse_qkv(ours, [parts.get(n) for n in names], (H * D, KV * D, KV * D), H, KV)
        if lora[ours][0].shape[0] != r:
            ranks[ours] = lora[ours][0].shape[0]
    return lora, ranks


def _fuse_qkv(ours: str, qkv: list, rows: tuple, H: int, KV: int) -> tuple:
    """One adapter on the fused q/k/v layer from up to three (None where absent)."""
    for part, n in zip(qkv, rows):
        if part is not None and part[1].shape[0] != n:
            raise PeftFormatError(f"{ours}: an adapter of {part[1].shape[0]} output rows where the layer has {n}")
    present = [p for p in qkv if p is not None]
    C = present[0][0].shape[1]
    if any(p[0].shape[1] != C for p in present):
        raise PeftFormatError(f"{ours}: q, k and v adapters of different input widths")
    Bs = [p[1] if p is not None else None for p in qkv]
    Bs = [_rope_to_pairs(b, h) if b is not None and i < 2 else b for i, (b, h) in enumerate(zip(Bs, (H, KV, KV)))]
    if all(p is not None for p in qkv) and all(np.array_equal(p[0], qkv[0][0]) for p in qkv):
        return qkv[0][0], np.concatenate(Bs)  # one shared A: exactly a rank-r fused adapter
    A = np.concatenate([p[0] for p in present])
    B = np.zeros((sum(rows), A.shape[0]), np.float32)
    row, col = 0, 0
    for b, n in zip(Bs, rows):
        if b is not None:
            B[row:row + n, col:col + b.shape[1]] = b
            col += b.shape[1]
        row += n
    return A, B
