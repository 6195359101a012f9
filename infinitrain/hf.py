"""Hugging Face transformers' formats, both ways: GPT-2 as `GPT2LMHeadModel` here, and the
LLaMA family (`LlamaForCausalLM`, `Qwen3ForCausalLM`, `MixtralForCausalLM`,
`Qwen3MoeForCausalLM`) in infinitrain.hf_llama — config.json with their keys, model.safetensors
with their tensor names and layouts —, so that `transformers.AutoModelForCausalLM.from_pretrained(
folder)` loads what `model.save_pretrained(folder)` writes, and `GPT2.from_pretrained` /
`LLaMA3.from_pretrained` read what transformers writes (one file or shards with
model.safetensors.index.json).

What differs for GPT-2, and is converted here: transformers keeps c_attn, c_proj and c_fc as
Conv1D weights, [in, out] (ours are nn.Linear's [out, in]); its embedding has exactly
vocab_size rows (ours is padded to a multiple of 64) and the LM head is tied to it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from . import hf_llama
from .io import DataFormatError

_MAX_SIZE = 1 << 24  # any one size of a config (layers, width, heads, vocabulary, positions)


# ---- exporting ---------------------------------------------------------------------------------

def export(model, full: dict) -> tuple:
    """(config.json as a dict, {transformers name: float32 array}) of a model, given its
    one-process tensors by our names."""
    kind = type(model).__name__
    cfg = model.config
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
        return hf_llama.export(cfg, full)
    raise TypeError(f"save_pretrained: no transformers layout for {kind}")


# ---- importing ---------------------------------------------------------------------------------

def is_transformers_config(config: dict) -> bool:
    return config.get("model_type") in ("gpt2",) + hf_llama.KINDS


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
    if kind not in hf_llama.KINDS:
        raise DataFormatError(f"{folder} holds a {kind!r} model, not one of the LLaMA family "
                              f"(model_type {', '.join(map(repr, hf_llama.KINDS))})")
    return hf_llama.config_of(cls, config, folder, _sizes, _positive_float)

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
    return hf_llama.expected_shapes(cfg, tied)

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
    return hf_llama.ours_from_theirs(cfg, theirs, tied)

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
