"""infinitrain.nn.functional: the functional forms users know from torch.nn.functional."""
from __future__ import annotations

from .._native import lib
from ..ops import math as _m
from ..ops import layers as _nn
from ..tensor import Tensor


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    return _nn.linear(input, weight, bias)


def layer_norm(input: Tensor, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    _check_normalized(input, normalized_shape)
    return _nn.layer_norm(input, weight, bias, eps)


def rms_norm(input: Tensor, normalized_shape, weight=None, eps: float | None = None) -> Tensor:
    _check_normalized(input, normalized_shape)
    return _nn.rms_norm(input, weight, 1e-6 if eps is None else eps)


def _check_normalized(x: Tensor, normalized_shape) -> None:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) != 1 or x.shape[-1:] != shape:
        raise ValueError(f"normalized_shape {shape} must be the last dimension of the input "
                         f"{tuple(x.shape)} (normalisation over one dimension is supported)")


def gelu(input: Tensor, approximate: str = "tanh") -> Tensor:
    if approximate != "tanh":
        raise NotImplementedError("gelu: only approximate='tanh' (GPT-2's GELU) is implemented")
    return _m.unary(lib.IT_GELU_TANH, input)


def silu(input: Tensor) -> Tensor:
    return _m.unary(lib.IT_SILU, input)


def relu(input: Tensor) -> Tensor:
    return _m.unary(lib.IT_RELU, input)


def sigmoid(input: Tensor) -> Tensor:
    return _m.unary(lib.IT_SIGMOID, input)


def tanh(input: Tensor) -> Tensor:
    return _m.unary(lib.IT_TANH, input)


def softmax(input: Tensor, dim: int = -1) -> Tensor:
    return _m.softmax(input, dim)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up, fused."""
    return _m.swiglu(gate, up)


def cross_entropy(input: Tensor, target: Tensor, ignore_index: int = -100,
                  reduction: str = "mean") -> Tensor:
    """input [N, C] (or [..., C] with target [...]) logits; target class indices."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if input.shape[:-1] != target.shape:
        raise ValueError(f"cross_entropy: logits {tuple(input.shape)} and targets {tuple(target.shape)} "
                         "do not match (expected logits [..., C] and targets [...])")
    out = _nn.cross_entropy(input.reshape(-1, input.shape[-1]), target.reshape(-1),
                            input.shape[-1], ignore_index, reduction)
    return out.reshape(target.shape) if reduction == "none" else out


def embedding(input: Tensor, weight: Tensor) -> Tensor:
    return _nn.Embedding.apply(input, weight)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """Causal attention over [B, H, T, D] (k/v may have fewer heads with enable_gqa=True)."""
    if attn_mask is not None or not is_causal:
        raise NotImplementedError("scaled_dot_product_attention: only is_causal=True without "
                                  "attn_mask is implemented")
    if dropout_p:
        raise NotImplementedError("scaled_dot_product_attention: attention dropout is not implemented")
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError(f"query has {query.shape[1]} heads and key {key.shape[1]}: pass "
                         "enable_gqa=True for grouped-query attention")
    return _nn.causal_attention(query, key, value, scale)


def rotary_embedding(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotates interleaved pairs of x [B, T, H, D] by the angles of cos/sin [T, D/2]."""
    return _nn.Rope.apply(x, cos, sin)


def dropout(input: Tensor, p: float = 0.5, training: bool = True, generator=None) -> Tensor:
    if not 0.0 <= p < 1.0:
        if p == 1.0:
            return input * 0.0
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return input
    return _nn.Dropout.apply(input, p, generator)
