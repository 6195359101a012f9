"""infinitrain.nn.functional: the functional forms users know from torch.nn.functional."""
from __future__ import annotations

from .. import dtypes as _dt
from .._native import lib
from ..ops import index as _idx
from ..ops import layers as _nn
from ..ops import math as _m
from ..tensor import Tensor
from .losses import (binary_cross_entropy, binary_cross_entropy_with_logits, cross_entropy,  # noqa: F401
                     l1_loss, mse_loss, nll_loss)


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    return _nn.linear(input, weight, bias)


def lora(input, lora_A, lora_B, scale: float):
    """scale · (x Aᵀ) Bᵀ: a LoRA adapter's update of a linear layer's output."""
    return linear(linear(input, lora_A), lora_B) * scale


def layer_norm(input: Tensor, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    _check_normalized(input, normalized_shape)
    if weight is None and bias is not None:  # the kernel takes a bias only with a weight
        from ..creation import ones
        weight = ones(input.shape[-1], dtype=bias.dtype, device=bias.device)
    return _nn.layer_norm(input, weight, bias, eps)


def rms_norm(input: Tensor, normalized_shape, weight=None, eps: float | None = None) -> Tensor:
    _check_normalized(input, normalized_shape)
    if eps is None:  # PyTorch's default: the machine epsilon of the input's dtype
        import ml_dtypes
        eps = float(ml_dtypes.finfo(input.dtype.numpy).eps)
    return _nn.rms_norm(input, weight, eps)


def _check_normalized(x: Tensor, normalized_shape) -> None:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) != 1 or x.shape[-1:] != shape:
        raise ValueError(f"normalized_shape {shape} must be the last dimension of the input "
                         f"{tuple(x.shape)} (normalisation over one dimension is supported)")


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    """PyTorch's: exact x·Φ(x) by default, approximate='tanh' GPT-2's tanh form."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _m.unary(lib.IT_GELU_TANH if approximate == "tanh" else lib.IT_GELU, input)


def silu(input: Tensor) -> Tensor:
    return _m.unary(lib.IT_SILU, input)


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    return input.relu_() if inplace else _m.unary(lib.IT_RELU, input)


def relu_(input: Tensor) -> Tensor:
    return input.relu_()


def sigmoid(input: Tensor) -> Tensor:
    return _m.unary(lib.IT_SIGMOID, input)


def tanh(input: Tensor) -> Tensor:
    return _m.unary(lib.IT_TANH, input)


def softmax(input: Tensor, dim: int = -1) -> Tensor:
    return _m.softmax(input, dim)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up, fused."""
    return _m.swiglu(gate, up)


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None) -> Tensor:
    """weight's rows at the ids of input. The row padding_idx gets no gradient (PyTorch's)."""
    if padding_idx is None:
        return _nn.Embedding.apply(input, weight)
    rows = weight.shape[0]
    if not -rows <= padding_idx < rows:
        raise ValueError(f"embedding: padding_idx {padding_idx} is not a row of a {rows}-row weight")
    pad = padding_idx % rows
    out = _nn.Embedding.apply(input, weight)
    # the padding positions' outputs are kept but cut from the graph: the row gets no gradient
    return out.masked_fill((input == pad).unsqueeze(-1), 0.0) + \
        weight.detach()[pad] * (input == pad).unsqueeze(-1).to(dtype=out.dtype)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False, generator=None) -> Tensor:
    """PyTorch's: query [N, H, L, E] (or [N, L, E]), key/value [N, H_kv, S, E] (fewer heads with
    enable_gqa=True). attn_mask broadcasts to [N, H, L, S]: bool (True: takes part) or float
    (added to the scores). is_causal masks key j > query i (the top-left triangle when L != S,
    as PyTorch). A query whose every key is masked out gives zeros. Fused: no L x S matrix is
    kept for the backward pass, the probabilities (and dropout's mask) are recomputed. generator
    (not PyTorch's, as F.dropout's): dropout's stream, the default one if None."""
    if not all(isinstance(t, Tensor) for t in (query, key, value)):
        raise TypeError("scaled_dot_product_attention: query, key and value must be tensors")
    if query.ndim not in (3, 4) or key.ndim != query.ndim or value.ndim != query.ndim:
        raise ValueError(f"scaled_dot_product_attention: query, key and value must all be [N, H, L, E] "
                         f"or all [N, L, E], got {tuple(query.shape)}, {tuple(key.shape)}, "
                         f"{tuple(value.shape)}")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"scaled_dot_product_attention: dropout_p must be in [0, 1], got {dropout_p}")
    if attn_mask is not None and is_causal:
        raise ValueError("scaled_dot_product_attention: pass attn_mask or is_causal=True, not both "
                         "(fold the causal mask into attn_mask)")
    if value.shape[-1] != query.shape[-1]:
        raise NotImplementedError(f"scaled_dot_product_attention: value's head size {value.shape[-1]} "
                                  f"differs from query's {query.shape[-1]} (equal sizes are implemented)")
    squeeze = query.ndim == 3  # [N, L, E]: one head
    if squeeze:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError(f"query has {query.shape[1]} heads and key {key.shape[1]}: pass "
                         "enable_gqa=True for grouped-query attention")
    L, S = query.shape[-2], key.shape[-2]
    bias, causal = None, is_causal
    if is_causal and L != S:  # PyTorch's triangle starts at the top left; the kernel's ends bottom right
        from ..creation import ones
        attn_mask, causal = ones(L, S, dtype=_dt.bool, device=query.device).tril(), False
    if attn_mask is not None:
        bias = attention_bias(attn_mask)
        if squeeze and bias.ndim == 3:  # [N, L, S] for [N, L, E] inputs
            bias = bias.unsqueeze(1)
    out = _nn.attention(query, key, value, scale, causal, bias, dropout_p, generator)
    return out.squeeze(1) if squeeze else out


def attention_bias(mask: Tensor, allowed: bool = True) -> Tensor:
    """A mask as the float32 scores bias attention adds: bool (where it equals `allowed`, the key
    takes part; elsewhere -inf) or float (added as it is). SDPA's bool masks say True = takes
    part, nn.MultiheadAttention's True = masked out (allowed=False)."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"attention mask must be a tensor, got {type(mask).__name__}")
    if mask.requires_grad:
        raise NotImplementedError("attention: a float mask that requires grad gets no gradient "
                                  "here; pass mask.detach() (a learned bias is not implemented)")
    if mask.dtype is _dt.bool:
        from ..creation import zeros
        blocked = mask.logical_not() if allowed else mask
        return _idx.masked_fill(zeros(*mask.shape, device=mask.device), blocked, float("-inf"))
    if not mask.dtype.is_floating_point:
        raise TypeError(f"attention mask must be bool or floating point, got {mask.dtype}")
    return mask if mask.dtype is _dt.float32 else mask.float()


def rotary_embedding(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotates interleaved pairs of x [B, T, H, D] by the angles of cos/sin [T, D/2]."""
    return _nn.Rope.apply(x, cos, sin)


def dropout(input: Tensor, p: float = 0.5, training: bool = True, generator=None) -> Tensor:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return input * 0.0
    return _nn.Dropout.apply(input, p, generator)


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Whole channels of an (N, C, H, W) or (C, H, W) input zeroed with probability p, the
    others scaled by 1 / (1 - p); the mask is drawn from infinitrain's generator."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout2d probability must be in [0, 1], got {p}")
    if inplace:
        raise NotImplementedError("dropout2d: inplace=True is not supported yet; use the returned tensor")
    if input.ndim not in (3, 4):
        raise ValueError(f"dropout2d: expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got shape "
                         f"{tuple(input.shape)}")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return input * 0.0
    from ..creation import rand
    keep = rand(tuple(input.shape[:-2]) + (1, 1), device=input.device) >= p
    return input * (keep.to(dtype=input.dtype) * (1.0 / (1.0 - p)))


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """x where x > 0, else negative_slope * x; the gradient at 0 is negative_slope, as PyTorch's."""
    if inplace:
        raise NotImplementedError("leaky_relu: inplace=True is not supported yet; write "
                                  "x = F.leaky_relu(x, negative_slope) (the same values, a new tensor)")
    return _idx.where(input > 0, input, input * negative_slope)


def log_softmax(input: Tensor, dim: int = -1) -> Tensor:
    return _idx.log_softmax(input, dim)


def logsumexp(input: Tensor, dim, keepdim: bool = False) -> Tensor:
    return _idx.logsumexp(input, dim, keepdim)


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out=None) -> Tensor:
    """input / max(its p-norm along dim, eps) (torch.nn.functional.normalize)."""
    if out is not None:
        raise NotImplementedError("normalize: out= is not implemented; use the returned tensor")
    if p == float("inf"):
        norm = input.abs().amax(dim, keepdim=True).clamp(min=eps)
    elif p == 2:  # the clamp before the root: a zero row's gradient is zero, not 0 * inf
        norm = (input * input).sum(dim, keepdim=True).clamp(min=eps * eps).sqrt()
    elif p == 1:
        norm = input.abs().sum(dim, keepdim=True).clamp(min=eps)
    elif p > 0:
        norm = (input.abs() ** p).sum(dim, keepdim=True).clamp(min=eps ** p) ** (1.0 / p)
    else:
        raise ValueError(f"normalize: p must be > 0, got {p}")
    return input / norm


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """int64 [..., num_classes] with a 1 at each index (torch.nn.functional.one_hot)."""
    from ..creation import arange
    if tensor.dtype not in (_dt.int32, _dt.int64):
        raise TypeError(f"one_hot: expected an integer tensor, got {tensor.dtype.name}")
    if num_classes < 0:
        num_classes = int(tensor.max().item()) + 1 if tensor.numel() else 0
    if tensor.numel() and (int(tensor.min().item()) < 0 or int(tensor.max().item()) >= num_classes):
        raise ValueError(f"one_hot: class values must be in [0, {num_classes})")
    return (tensor.long().unsqueeze(-1) == arange(num_classes, device=tensor.device)).long()


def pad(input: Tensor, pad: tuple, mode: str = "constant", value: float = 0.0) -> Tensor:
    """Constant padding; pad = (left, right) for the last dimension, then (top, bottom) for
    the one before, ... (torch.nn.functional.pad). Negative amounts crop."""
    if mode != "constant":
        raise NotImplementedError(f"pad: only mode='constant' is implemented, got {mode!r}")
    if len(pad) % 2 or len(pad) // 2 > input.ndim:
        raise ValueError(f"pad: {tuple(pad)} must hold (before, after) pairs for at most "
                         f"{input.ndim} dimensions")
    from ..creation import full
    from ..ops.shape import cat
    out = input
    for i in range(len(pad) // 2):
        d = out.ndim - 1 - i
        before, after = pad[2 * i], pad[2 * i + 1]
        if before < 0:
            out, before = out.narrow(d, -before, out.shape[d] + before), 0
        if after < 0:
            out, after = out.narrow(d, 0, out.shape[d] + after), 0
        parts = []
        for n in (before, None, after):
            if n is None:
                parts.append(out)
            elif n:
                shape = out.shape[:d] + (n,) + out.shape[d + 1:]
                parts.append(full(shape, value, dtype=out.dtype, device=out.device))
        out = cat(parts, d) if len(parts) > 1 else out
    return out


from .functional_conv import (adaptive_avg_pool2d, avg_pool2d, batch_norm, conv1d, conv2d,  # noqa: E402,F401
                              group_norm, max_pool2d)
from .functional_conv import conv_transpose2d  # noqa: E402,F401
