"""Hugging Face transformers' formats, both ways: GPT-2 as `GPT2LMHeadModel` and LLaMA-3 as
`LlamaForCausalLM` (config.json with their keys, model.safetensors with their tensor names and
layouts), so that `transformers.AutoModelForCausalLM.from_pretrained(folder)` loads what
`model.save_pretrained(folder)` writes, and `GPT2.from_pretrained` / `LLaMA3.from_pretrained`
read what transformers writes (one file or shards with model.safetensors.index.json).

What differs between the two layouts, and is converted here:
- GPT-2: transformers keeps c_attn, c_proj and c_fc as Conv1D weights, [in, out] (ours are
  nn.Linear's [out, in]); its embedding has exactly vocab_size rows (ours is padded to a
  multiple of 64) and the LM head is tied to it.
- LLaMA: q, k and v are three projections (ours one fused c_attn); the MLP's gate and up are
  gate_proj and up_proj (our c_fc2 and c_fc); rotary pairs are the two halves of each head
  (ours interleaved, Meta's and llm.c's order), so the rows of q_proj and k_proj are permuted
  as transformers' own LLaMA converter permutes them.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .io import DataFormatError

# transformers' LLaMA-3.1 rope scaling, which ours computes with these constants
_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
_MAX_SIZE = 1 << 24  # any one size of a config (layers, width, heads, vocabulary, positions)


# ---- exporting ---------------------------------------------------------------------------------

def _rope_to_halves(w: np.ndarray, heads: int) -> np.ndarray:
    """Rows of q/k projections from interleaved rotary pairs (2i, 2i+1) to halves (i, i + d/2)."""
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def _rope_to_pairs(w: np.ndarray, heads: int) -> np.ndarray:
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def export(model, full: dict) -> tuple:
    """(config.json as a dict, {transformers name: float32 array}) of a model, given its
    one-process tensors by our names."""
    kind = type(model).__name__
    cfg = model.config
    if getattr(cfg, "num_experts", 0):
        raise NotImplementedError(f"transformers' format for a mixture-of-experts {kind} ({cfg.num_experts} experts "
                                  "per MoE layer) is not written yet: save it with save_checkpoint")
    if kind == "GPT2":
        V, C = cfg.vocab_size, cfg.n_embd
        config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V,
                  "n_positions": cfg.block_size, "n_ctx": cfg.block_size, "n_embd": C, "n_layer": cfg.n_layer,
                  "n_head": cfg.n_head, "n_inner": None, "activation_function": "gelu_new",
                  "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                  "attn_pdrop": 0.0, "bos_token_id": 50256, "eos_token_id": 50256, "torch_dtype": "float32"}
        tensors = {}
        for name, a in full.items():
            if name == "lm_head.weight":
                continue  # tied to wte
            if name == "transformer.wte.weight":
                a = a[:V]
            elif name.endswith(("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")):
                a = a.T  # Conv1D: [in, out]
            tensors[name] = np.ascontiguousarray(a)  # (safetensors writes a view's memory as it lies)
        return config, tensors
    if kind == "LLaMA3":
        H, KV, D = cfg.n_head, cfg.n_kv_head, cfg.n_embd // cfg.n_head
        config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
                  "hidden_size": cfg.n_embd, "intermediate_size": cfg.ffn_hidden, "num_hidden_layers": cfg.n_layer,
                  "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": D,
                  "max_position_embeddings": cfg.block_size, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
                  "rope_scaling": ({"rope_type": "llama3", "factor": cfg.rope_scaling_factor, **_LLAMA3_ROPE}
                                   if cfg.use_scaled_rope else None),
                  "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
                  "torch_dtype": "float32"}
        tensors = {"model.embed_tokens.weight": full["transformer.wte.weight"][:cfg.vocab_size],
                   "model.norm.weight": full["transformer.ln_f.weight"],
                   "lm_head.weight": full["lm_head.weight"][:cfg.vocab_size]}
        for i in range(cfg.n_layer):
            ours, theirs = f"transformer.h.{i}.", f"model.layers.{i}."
            q, k, v = np.split(full[ours + "attn.c_attn.weight"], [H * D, (H + KV) * D])
            tensors.update({
                theirs + "self_attn.q_proj.weight": _rope_to_halves(q, H),
                theirs + "self_attn.k_proj.weight": _rope_to_halves(k, KV),
                theirs + "self_attn.v_proj.weight": v,
                theirs + "self_attn.o_proj.weight": full[ours + "attn.c_proj.weight"],
                theirs + "mlp.gate_proj.weight": full[ours + "mlp.c_fc2.weight"],
                theirs + "mlp.up_proj.weight": full[ours + "mlp.c_fc.weight"],
                theirs + "mlp.down_proj.weight": full[ours + "mlp.c_proj.weight"],
                theirs + "input_layernorm.weight": full[ours + "ln_1.weight"],
                theirs + "post_attention_layernorm.weight": full[ours + "ln_2.weight"]})
        return config, {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    raise TypeError(f"save_pretrained: no transformers layout for {kind}")


# ---- importing ---------------------------------------------------------------------------------

def is_transformers_config(config: dict) -> bool:
    return config.get("model_type") in ("gpt2", "llama")


def _sizes(config: dict, folder, keys) -> dict:
    """The config's sizes, each an integer in [1, 2^24], or a DataFormatError naming it."""
    out = {}
    for key in keys:
        v = config.get(key)
        if type(v) is not int or not 1 <= v <= _MAX_SIZE:
            raise DataFormatError(f"{folder}/config.json: {key} must be an integer in [1, {_MAX_SIZE}], got {v!r}")
        out[key] = v
    return out


def _positive_float(config: dict, folder, key: str, default: float) -> float:
    v = config.get(key, default)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
        raise DataFormatError(f"{folder}/config.json: {key} must be a finite number > 0, got {v!r}")
    return float(v)


def config_of(cls, config: dict, folder):
    """Our model config for a transformers config.json, checked before anything is built."""
    kind = config.get("model_type")
    if cls.__name__ == "GPT2":
        if kind != "gpt2":
            raise DataFormatError(f"{folder} holds a {kind!r} model, not GPT-2 (model_type 'gpt2')")
        s = _sizes(config, folder, ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"))
        act = config.get("activation_function", "gelu_new")
        inner = config.get("n_inner")
        eps = _positive_float(config, folder, "layer_norm_epsilon", 1e-5)
        if act not in ("gelu_new", "gelu_pytorch_tanh") or inner not in (None, 4 * s["n_embd"]) \
                or abs(eps - 1e-5) > 1e-12 or config.get("tie_word_embeddings", True) is not True:
            raise DataFormatError(f"{folder}/config.json: this GPT-2 differs from the one infinitrain builds "
                                  f"(tanh GELU, n_inner 4 x n_embd, layer_norm_epsilon 1e-5, tied head); it has "
                                  f"activation_function={act!r}, n_inner={inner!r}, layer_norm_epsilon={eps!r}, "
                                  f"tie_word_embeddings={config.get('tie_word_embeddings', True)!r}")
        if s["n_embd"] % s["n_head"]:
            raise DataFormatError(f"{folder}/config.json: n_embd {s['n_embd']} is not a multiple of "
                                  f"n_head {s['n_head']}")
        return cls.config_class(block_size=s["n_positions"], vocab_size=s["vocab_size"], n_layer=s["n_layer"],
                                n_head=s["n_head"], n_embd=s["n_embd"])
    if kind != "llama":
        raise DataFormatError(f"{folder} holds a {kind!r} model, not LLaMA (model_type 'llama')")
    s = _sizes(config, folder, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "max_position_embeddings"))
    heads, width = s["num_attention_heads"], s["hidden_size"]
    kv = config.get("num_key_value_heads", heads)
    if type(kv) is not int or kv < 1 or heads % kv or width % heads:
        raise DataFormatError(f"{folder}/config.json: num_key_value_heads {kv!r} must divide num_attention_heads "
                              f"{heads}, which must divide hidden_size {width}")
    if config.get("head_dim", width // heads) != width // heads or config.get("hidden_act", "silu") != "silu" \
            or config.get("attention_bias") or config.get("mlp_bias"):
        raise DataFormatError(f"{folder}/config.json: this LLaMA differs from the one infinitrain builds "
                              "(head_dim = hidden_size / heads, silu, no biases)")
    # transformers 4 writes rope_theta and rope_scaling; 5 writes rope_parameters (theta inside)
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
        scaling = rope if rope.get("rope_type", "default") != "default" else None
    else:
        theta, scaling = config.get("rope_theta", 10000.0), config.get("rope_scaling")
    factor = 8.0
    if scaling is not None:
        kind_ = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
        if kind_ != "llama3" or any(scaling.get(k) != v for k, v in _LLAMA3_ROPE.items()):
            raise DataFormatError(f"{folder}/config.json: rope_scaling {scaling!r} is not LLaMA-3.1's "
                                  f"(rope_type 'llama3' with {_LLAMA3_ROPE})")
        factor = _positive_float(scaling, folder, "factor", 8.0)
    hidden = 2 * (4 * width) // 3
    cfg = cls.config_class(block_size=s["max_position_embeddings"], vocab_size=s["vocab_size"],
                           n_layer=s["num_hidden_layers"], n_head=heads, n_kv_head=kv, n_embd=width,
                           ffn_dim_multiplier=s["intermediate_size"] / hidden, multiple_of=1,
                           norm_eps=_positive_float(config, folder, "rms_norm_eps", 1e-5),
                           rope_theta=_positive_float({"rope_theta": theta}, folder, "rope_theta", 10000.0),
                           use_scaled_rope=scaling is not None, rope_scaling_factor=factor)
    if cfg.ffn_hidden != s["intermediate_size"]:
        raise DataFormatError(f"{folder}/config.json: intermediate_size {s['intermediate_size']} cannot be built")
    return cfg


def expected_shapes(cls, cfg, tied: bool) -> dict:
    """{transformers name: shape} that a checkpoint of this config holds."""
    C, L = cfg.n_embd, cfg.n_layer
    if cls.__name__ == "GPT2":
        shapes = {"transformer.wte.weight": (cfg.vocab_size, C), "transformer.wpe.weight": (cfg.block_size, C),
                  "transformer.ln_f.weight": (C,), "transformer.ln_f.bias": (C,)}
        for i in range(L):
            p = f"transformer.h.{i}."
            shapes.update({p + "ln_1.weight": (C,), p + "ln_1.bias": (C,),
                           p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
                           p + "attn.c_attn.weight": (C, 3 * C), p + "attn.c_attn.bias": (3 * C,),
                           p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
                           p + "mlp.c_fc.weight": (C, 4 * C), p + "mlp.c_fc.bias": (4 * C,),
                           p + "mlp.c_proj.weight": (4 * C, C), p + "mlp.c_proj.bias": (C,)})
        return shapes
    H, KV, D, F = cfg.n_head, cfg.n_kv_head, C // cfg.n_head, cfg.ffn_hidden
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, C), "model.norm.weight": (C,)}
    if not tied:
        shapes["lm_head.weight"] = (cfg.vocab_size, C)
    for i in range(L):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (H * D, C), p + "self_attn.k_proj.weight": (KV * D, C),
                       p + "self_attn.v_proj.weight": (KV * D, C), p + "self_attn.o_proj.weight": (C, H * D),
                       p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
                       p + "mlp.down_proj.weight": (C, F), p + "input_layernorm.weight": (C,),
                       p + "post_attention_layernorm.weight": (C,)})
    return shapes


def ours_from_theirs(cls, cfg, theirs, tied: bool) -> dict:
    """{our name: a function giving the one-process float32 array}, reading transformers'
    tensors (theirs(name) -> array) only when asked (a pipeline stage asks for its layers)."""
    f32 = lambda a: np.array(a, dtype=np.float32)  # noqa: E731  (a copy: the files are mapped read-only)
    out = {}
    if cls.__name__ == "GPT2":
        pad = cfg.padded_vocab_size - cfg.vocab_size

        def wte():
            a = f32(theirs("transformer.wte.weight"))
            return np.concatenate([a, np.zeros((pad, a.shape[1]), np.float32)]) if pad else a
        out["transformer.wte.weight"] = wte
        out["lm_head.weight"] = wte
        for name in expected_shapes(cls, cfg, True):
            if name == "transformer.wte.weight":
                continue
            conv = name.endswith(("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"))
            out[name] = (lambda n=name, t=conv: np.ascontiguousarray(f32(theirs(n)).T) if t else f32(theirs(n)))
        return out
    H, KV = cfg.n_head, cfg.n_kv_head
    out["transformer.wte.weight"] = lambda: f32(theirs("model.embed_tokens.weight"))
    out["transformer.ln_f.weight"] = lambda: f32(theirs("model.norm.weight"))
    out["lm_head.weight"] = lambda: f32(theirs("model.embed_tokens.weight" if tied else "lm_head.weight"))
    for i in range(cfg.n_layer):
        ours, p = f"transformer.h.{i}.", f"model.layers.{i}."
        out[ours + "attn.c_attn.weight"] = lambda p=p: np.concatenate(
            [_rope_to_pairs(f32(theirs(p + "self_attn.q_proj.weight")), H),
             _rope_to_pairs(f32(theirs(p + "self_attn.k_proj.weight")), KV),
             f32(theirs(p + "self_attn.v_proj.weight"))])
        for mine, name in (("attn.c_proj.weight", "self_attn.o_proj.weight"),
                           ("mlp.c_fc2.weight", "mlp.gate_proj.weight"),
                           ("mlp.c_fc.weight", "mlp.up_proj.weight"), ("mlp.c_proj.weight", "mlp.down_proj.weight"),
                           ("ln_1.weight", "input_layernorm.weight"),
                           ("ln_2.weight", "post_attention_layernorm.weight")):
            out[ours + mine] = lambda n=p + name: f32(theirs(n))
    return out


def safetensors_files(folder: Path) -> list:
    """The weight files of a folder: model.safetensors, or the shards its index names."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise DataFormatError(f"{index} is not a safetensors index ({type(e).__name__}: {e})") from None
        for f in files:
            if not isinstance(f, str) or "/" in f or f.startswith(".") or not (folder / f).is_file():
                raise DataFormatError(f"{index} names {f!r}, which is not a file of {folder}")
        return [folder / f for f in files]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    raise DataFormatError(f"{folder} holds no model.safetensors (nor model.safetensors.index.json)")


class SafetensorsFiles:
    """The tensors of one or more safetensors files, read lazily (memory-mapped) by name. The
    header of each file is checked against the file itself (dtypes, shapes, offsets inside
    the file) before any tensor is read."""

    DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}

    def __init__(self, files):
        import ml_dtypes
        self.DTYPES = dict(self.DTYPES, BF16=ml_dtypes.bfloat16)
        self.where = {}
        for path in files:
            size = path.stat().st_size
            try:
                with open(path, "rb") as f:
                    n = int.from_bytes(f.read(8), "little")
                    if not 2 <= n <= min(size - 8, 100 << 20):
                        raise ValueError(f"a header of {n} bytes")
                    header = json.loads(f.read(n))
            except (OSError, ValueError) as e:
                raise DataFormatError(f"{path} is not a safetensors file ({e})") from None
            if not isinstance(header, dict):
                raise DataFormatError(f"{path} is not a safetensors file (its header is not an object)")
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                try:
                    dtype = self.DTYPES[entry["dtype"]]
                    shape = tuple(int(d) for d in entry["shape"])
                    begin, end = (int(o) for o in entry["data_offsets"])
                except (KeyError, TypeError, ValueError):
                    raise DataFormatError(f"{path}: tensor {name!r} has dtype {str(entry)[:80]}; "
                                          f"floats ({', '.join(self.DTYPES)}) are read") from None
                nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                if min(shape, default=1) < 0 or end - begin != nbytes or begin < 0 or 8 + n + end > size:
                    raise DataFormatError(f"{path}: tensor {name!r} ({shape}, {entry['dtype']}) does not fit "
                                          f"its bytes [{begin}, {end}) in a file of {size} bytes (truncated?)")
                self.where[name] = (path, 8 + n + begin, dtype, shape)

    def shape(self, name: str) -> tuple:
        return self.where[name][3]

    def __call__(self, name: str) -> np.ndarray:
        path, offset, dtype, shape = self.where[name]
        if not int(np.prod(shape)):
            return np.zeros(shape, np.float32)
        return np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r", offset=offset, shape=shape)
