"""The LLaMA family in Hugging Face transformers' format, both ways: `LlamaForCausalLM`,
`Qwen3ForCausalLM` (QK-norm, heads wider than hidden_size / heads), and the mixtures of experts
`MixtralForCausalLM` and `Qwen3MoeForCausalLM`, all built here as LLaMA3 (infinitrain.hf
dispatches to this module).

What differs from our layout, and is converted here:
- q, k and v are three projections (ours one fused c_attn); the dense MLP's gate and up are
  gate_proj and up_proj (our c_fc2 and c_fc); rotary pairs are the two halves of each head
  (ours interleaved, Meta's and llm.c's order), so the rows of q_proj and k_proj are permuted
  as transformers' own LLaMA converter permutes them, and QK-norm's weights (one per head
  dimension) with them.
- Experts are saved per expert on disk by both (transformers 5 fuses them in memory only):
  Mixtral's `block_sparse_moe.experts.{e}.w1/w3/w2` are our `mlp.experts.{e}.gate_proj/
  up_proj/down_proj`, its router `block_sparse_moe.gate`; Qwen3-MoE's names are ours.
"""
from __future__ import annotations

import numpy as np

from .io import DataFormatError

# transformers' LLaMA-3.1 rope scaling, which ours computes with these constants
_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
KINDS = ("llama", "qwen3", "mixtral", "qwen3_moe")
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM",
                  "qwen3_moe": "Qwen3MoeForCausalLM"}


def _rope_to_halves(w: np.ndarray, heads: int) -> np.ndarray:
    """Rows of q/k projections from interleaved rotary pairs (2i, 2i+1) to halves (i, i + d/2)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)


def _rope_to_pairs(w: np.ndarray, heads: int) -> np.ndarray:
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)


def kind_of(cfg) -> str:
    """The transformers model_type a LLaMA3Config is written as."""
    experts = getattr(cfg, "num_experts", 0)
    if experts:
        return "qwen3_moe" if cfg.qk_norm else "mixtral"
    return "qwen3" if cfg.qk_norm or cfg.head_size is not None else "llama"


def _moe_layers(cfg) -> list:
    return [i for i in range(cfg.n_layer) if cfg.is_moe_layer(i)] if getattr(cfg, "num_experts", 0) else []


def _mlp_names(kind: str) -> tuple:
    """(the MoE block's prefix, {our expert projection: theirs})."""
    if kind == "mixtral":
        return "block_sparse_moe.", {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    return "mlp.", {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}


# ---- exporting ---------------------------------------------------------------------------------

def export(cfg, full: dict) -> tuple:
    """(config.json as a dict, {transformers name: float32 array}) of a LLaMA3, given its
    one-process tensors by our names."""
    kind = kind_of(cfg)
    check_exportable(cfg, kind)
    H, KV, D = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    config = {"architectures": [_ARCHITECTURES[kind]], "model_type": kind, "vocab_size": cfg.vocab_size,
              "hidden_size": cfg.n_embd, "intermediate_size": cfg.ffn_hidden, "num_hidden_layers": cfg.n_layer,
              "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": D,
              "max_position_embeddings": cfg.block_size, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
              "rope_scaling": ({"rope_type": "llama3", "factor": cfg.rope_scaling_factor, **_LLAMA3_ROPE}
                               if cfg.use_scaled_rope else None),
              "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
              "torch_dtype": "float32"}
    if kind != "llama":
        config.update(sliding_window=None, use_sliding_window=False)
    moe = _moe_layers(cfg)
    if kind == "mixtral":
        config.update(num_local_experts=cfg.num_experts, num_experts_per_tok=cfg.moe_top_k,
                      intermediate_size=cfg.expert_ffn_hidden, router_jitter_noise=0.0)
    elif kind == "qwen3_moe":
        config.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.moe_top_k,
                      moe_intermediate_size=cfg.expert_ffn_hidden, norm_topk_prob=cfg.moe_norm_topk_prob,
                      decoder_sparse_step=1, mlp_only_layers=[i for i in range(cfg.n_layer) if i not in moe])
    tensors = {"model.embed_tokens.weight": full["transformer.wte.weight"][:cfg.vocab_size],
               "model.norm.weight": full["transformer.ln_f.weight"],
               "lm_head.weight": full["lm_head.weight"][:cfg.vocab_size]}
    block, proj = _mlp_names(kind)
    for i in range(cfg.n_layer):
        ours, theirs = f"transformer.h.{i}.", f"model.layers.{i}."
        q, k, v = np.split(full[ours + "attn.c_attn.weight"], [H * D, (H + KV) * D])
        tensors.update({
            theirs + "self_attn.q_proj.weight": _rope_to_halves(q, H),
            theirs + "self_attn.k_proj.weight": _rope_to_halves(k, KV),
            theirs + "self_attn.v_proj.weight": v,
            theirs + "self_attn.o_proj.weight": full[ours + "attn.c_proj.weight"],
            theirs + "input_layernorm.weight": full[ours + "ln_1.weight"],
            theirs + "post_attention_layernorm.weight": full[ours + "ln_2.weight"]})
        if cfg.qk_norm:
            tensors[theirs + "self_attn.q_norm.weight"] = _rope_to_halves(full[ours + "attn.q_norm.weight"], 1)
            tensors[theirs + "self_attn.k_norm.weight"] = _rope_to_halves(full[ours + "attn.k_norm.weight"], 1)
        if i in moe:
            tensors[theirs + block + "gate.weight"] = full[ours + "mlp.gate.weight"]
            for e in range(cfg.num_experts):
                for mine, name in proj.items():
                    tensors[f"{theirs}{block}experts.{e}.{name}.weight"] = full[f"{ours}mlp.experts.{e}.{mine}.weight"]
        else:
            tensors.update({theirs + "mlp.gate_proj.weight": full[ours + "mlp.c_fc2.weight"],
                            theirs + "mlp.up_proj.weight": full[ours + "mlp.c_fc.weight"],
                            theirs + "mlp.down_proj.weight": full[ours + "mlp.c_proj.weight"]})
    return config, {k: np.ascontiguousarray(v) for k, v in tensors.items()}


def check_exportable(cfg, kind: str | None = None) -> None:
    """transformers' two mixtures route with a softmax over every expert, no shared experts, no
    selection bias, and Mixtral renormalises the chosen weights: a ValueError otherwise."""
    kind = kind or kind_of(cfg)
    if kind not in ("mixtral", "qwen3_moe"):
        return
    if cfg.moe_shared_experts or cfg.moe_router != "softmax" or cfg.moe_bias_update_rate:
        raise ValueError(f"save_pretrained: {_ARCHITECTURES[kind]} routes with a softmax, without shared experts or "
                         f"selection biases; this model has moe_router={cfg.moe_router!r}, moe_shared_experts="
                         f"{cfg.moe_shared_experts}, moe_bias_update_rate={cfg.moe_bias_update_rate}")
    if kind == "mixtral" and not cfg.moe_norm_topk_prob:
        raise ValueError("save_pretrained: MixtralForCausalLM renormalises the chosen experts' weights: build the "
                         "model with moe_norm_topk_prob=True (or with qk_norm=True, saved as Qwen3MoeForCausalLM)")


# ---- importing ---------------------------------------------------------------------------------

def config_of(cls, config: dict, folder, sizes, positive_float):
    """Our LLaMA3Config for a transformers config.json of the family, checked before anything
    is built (sizes / positive_float: infinitrain.hf's checked readers)."""
    kind = config.get("model_type")
    s = sizes(config, folder, ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                               "max_position_embeddings"))
    heads, width = s["num_attention_heads"], s["hidden_size"]
    kv = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or (width // heads if width % heads == 0 else None)
    if type(kv) is not int or kv < 1 or heads % kv or type(head_dim) is not int or head_dim < 2 or head_dim % 2:
        raise DataFormatError(f"{folder}/config.json: num_key_value_heads {kv!r} must divide num_attention_heads "
                              f"{heads}, and head_dim {head_dim!r} (or hidden_size / heads) be an even integer")
    if kind == "llama" and head_dim * heads != width:
        raise DataFormatError(f"{folder}/config.json: this LLaMA's head_dim {head_dim} x {heads} heads is not its "
                              f"hidden_size {width} (LlamaForCausalLM allows it; infinitrain builds it as Qwen3)")
    if config.get("hidden_act", "silu") != "silu" or config.get("attention_bias") or config.get("mlp_bias") \
            or config.get("use_sliding_window") or (kind == "mixtral" and config.get("sliding_window")):
        raise DataFormatError(f"{folder}/config.json: this {kind} differs from the one infinitrain builds "
                              "(silu, no biases, no sliding window)")
    theta, scaling = _rope(config)
    factor = 8.0
    if scaling is not None:
        kind_ = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
        if kind_ != "llama3" or any(scaling.get(k) != v for k, v in _LLAMA3_ROPE.items()):
            raise DataFormatError(f"{folder}/config.json: rope_scaling {scaling!r} is not LLaMA-3.1's "
                                  f"(rope_type 'llama3' with {_LLAMA3_ROPE})")
        factor = positive_float(scaling, folder, "factor", 8.0)
    dense = config.get("intermediate_size")
    extra = dict(head_size=None if head_dim * heads == width else head_dim, qk_norm=kind in ("qwen3", "qwen3_moe"))
    extra.update(_experts_of(kind, config, folder, sizes, s["num_hidden_layers"]))
    if kind == "mixtral":
        dense = None  # every layer is a mixture: intermediate_size is the experts' width
    elif type(dense) is not int or not 1 <= dense <= 1 << 24:
        raise DataFormatError(f"{folder}/config.json: intermediate_size must be an integer in [1, 2^24], "
                              f"got {dense!r}")
    hidden = 2 * (4 * width) // 3
    cfg = cls.config_class(block_size=s["max_position_embeddings"], vocab_size=s["vocab_size"],
                           n_layer=s["num_hidden_layers"], n_head=heads, n_kv_head=kv, n_embd=width,
                           ffn_dim_multiplier=(dense or hidden) / hidden, multiple_of=1,
                           norm_eps=positive_float(config, folder, "rms_norm_eps", 1e-5),
                           rope_theta=positive_float({"rope_theta": theta}, folder, "rope_theta", 10000.0),
                           use_scaled_rope=scaling is not None, rope_scaling_factor=factor, **extra)
    if dense and cfg.ffn_hidden != dense:
        raise DataFormatError(f"{folder}/config.json: intermediate_size {dense} cannot be built")
    try:
        cfg.validate()
    except ValueError as e:
        raise DataFormatError(f"{folder}/config.json describes no model infinitrain can build: {e}") from None
    return cfg


def _rope(config: dict) -> tuple:
    """(rope_theta, the scaling dict or None): transformers 4 writes rope_theta and
    rope_scaling, 5 writes rope_parameters (theta inside)."""
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
        return theta, (rope if rope.get("rope_type", "default") != "default" else None)
    return config.get("rope_theta", 10000.0), config.get("rope_scaling")


def _experts_of(kind: str, config: dict, folder, sizes, layers: int) -> dict:
    """The MoE fields of our config for Mixtral's and Qwen3-MoE's keys ({} for a dense model)."""
    if kind not in ("mixtral", "qwen3_moe"):
        return {}
    if kind == "mixtral":
        s = sizes(config, folder, ("num_local_experts", "num_experts_per_tok", "intermediate_size"))
        if config.get("router_jitter_noise", 0.0):
            raise DataFormatError(f"{folder}/config.json: router_jitter_noise {config['router_jitter_noise']} "
                                  "is not built here (0 is)")
        return dict(num_experts=s["num_local_experts"], moe_top_k=s["num_experts_per_tok"],
                    moe_ffn_hidden=s["intermediate_size"], moe_norm_topk_prob=True)
    key = "num_experts" if "num_experts" in config else "num_local_experts"
    s = sizes(config, folder, (key, "num_experts_per_tok", "moe_intermediate_size"))
    step, dense = config.get("decoder_sparse_step", 1), config.get("mlp_only_layers", [])
    if type(step) is not int or step < 1 or not isinstance(dense, list):
        raise DataFormatError(f"{folder}/config.json: decoder_sparse_step {step!r} and mlp_only_layers "
                              f"{dense!r} must be a positive integer and a list")
    sparse = [i for i in range(layers) if i not in dense and (i + 1) % step == 0]
    freq = _layer_freq(sparse, layers)
    if freq is None:
        raise DataFormatError(f"{folder}/config.json: its mixture-of-experts layers {sparse} (decoder_sparse_step "
                              f"{step}, mlp_only_layers {dense}) are not every n-th layer from the first, the "
                              "placement infinitrain builds (moe_layer_freq)")
    return dict(num_experts=s[key], moe_top_k=s["num_experts_per_tok"], moe_ffn_hidden=s["moe_intermediate_size"],
                moe_norm_topk_prob=bool(config.get("norm_topk_prob", False)), moe_layer_freq=freq)


def _layer_freq(sparse: list, layers: int):
    """n such that `sparse` is every n-th of `layers` layers from the first, or None."""
    for n in range(1, layers + 1):
        if sparse == list(range(0, layers, n)):
            return n
    return None


def expected_shapes(cfg, tied: bool) -> dict:
    """{transformers name: shape} that a checkpoint of this config holds."""
    kind = kind_of(cfg)
    C, H, KV, D, F = cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.ffn_hidden
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, C), "model.norm.weight": (C,)}
    if not tied:
        shapes["lm_head.weight"] = (cfg.vocab_size, C)
    moe, (block, proj) = _moe_layers(cfg), _mlp_names(kind)
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (H * D, C), p + "self_attn.k_proj.weight": (KV * D, C),
                       p + "self_attn.v_proj.weight": (KV * D, C), p + "self_attn.o_proj.weight": (C, H * D),
                       p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,)})
        if cfg.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,)})
        if i in moe:
            E, Fe = cfg.num_experts, cfg.expert_ffn_hidden
            shapes[p + block + "gate.weight"] = (E, C)
            for e in range(E):
                shapes.update({f"{p}{block}experts.{e}.{proj['gate_proj']}.weight": (Fe, C),
                               f"{p}{block}experts.{e}.{proj['up_proj']}.weight": (Fe, C),
                               f"{p}{block}experts.{e}.{proj['down_proj']}.weight": (C, Fe)})
        else:
            shapes.update({p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
                           p + "mlp.down_proj.weight": (C, F)})
    return shapes


def ours_from_theirs(cfg, theirs, tied: bool) -> dict:
    """{our name: a function giving the one-process float32 array}, reading transformers'
    tensors (theirs(name) -> array) only when asked (a pipeline stage asks for its layers, an
    expert-parallel rank for its experts)."""
    f32 = lambda a: np.array(a, dtype=np.float32)  # noqa: E731  (a copy: the files are mapped read-only)
    H, KV = cfg.n_head, cfg.n_kv_head
    out = {"transformer.wte.weight": lambda: f32(theirs("model.embed_tokens.weight")),
           "transformer.ln_f.weight": lambda: f32(theirs("model.norm.weight")),
           "lm_head.weight": lambda: f32(theirs("model.embed_tokens.weight" if tied else "lm_head.weight"))}
    moe, (block, proj) = _moe_layers(cfg), _mlp_names(kind_of(cfg))
    for i in range(cfg.n_layer):
        ours, p = f"transformer.h.{i}.", f"model.layers.{i}."
        out[ours + "attn.c_attn.weight"] = lambda p=p: np.concatenate(
            [_rope_to_pairs(f32(theirs(p + "self_attn.q_proj.weight")), H),
             _rope_to_pairs(f32(theirs(p + "self_attn.k_proj.weight")), KV),
             f32(theirs(p + "self_attn.v_proj.weight"))])
        same = {"attn.c_proj.weight": "self_attn.o_proj.weight", "ln_1.weight": "input_layernorm.weight",
                "ln_2.weight": "post_attention_layernorm.weight"}
        if i in moe:
            same["mlp.gate.weight"] = block + "gate.weight"
            for e in range(cfg.num_experts):
                same.update({f"mlp.experts.{e}.{mine}.weight": f"{block}experts.{e}.{name}.weight"
                             for mine, name in proj.items()})
        else:
            same.update({"mlp.c_fc2.weight": "mlp.gate_proj.weight", "mlp.c_fc.weight": "mlp.up_proj.weight",
                         "mlp.c_proj.weight": "mlp.down_proj.weight"})
        for mine, name in same.items():
            out[ours + mine] = lambda n=p + name: f32(theirs(n))
        if cfg.qk_norm:
            for mine in ("q_norm", "k_norm"):
                out[f"{ours}attn.{mine}.weight"] = lambda n=f"{p}self_attn.{mine}.weight": _rope_to_pairs(
                    f32(theirs(n)), 1)
    return out
