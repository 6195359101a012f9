"""Normalisation, softmax, cross-entropy, attention, rotary and token embeddings.

Forward functions return what their backward needs (mean/rstd, log-sum-exp); the backward
functions return input gradients plus parameter gradients where there are parameters.
"""
from __future__ import annotations

import math
from .. import dtypes as _dt
from .._native import check, ffi, lib
from ..tensor import Tensor, _empty, _wrap_dim
from .. import _trace
from . import _checks

_NULL = ffi.NULL


def _ptr_or_null(t):
    return _NULL if t is None else t._ptr()


def _f32_ptr(t: Tensor):
    return ffi.cast("float *", t.data_ptr())


def _rows(x: Tensor) -> tuple:
    return math.prod(x.shape[:-1]), x.shape[-1]


def _check_params(op: str, x: Tensor, **params) -> None:
    for name, p in params.items():
        if p is None:
            continue
        _checks.same_device(op, input=x, **{name: p})
        _checks.same_dtype(op, input=x, **{name: p})
        _checks.shape_is(op, name, p, (x.shape[-1],))


# ---- LayerNorm / RMSNorm -------------------------------------------------------------------
@_trace.traced("kernel")
def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float = 1e-5):
    """Returns (out, mean, rstd) with mean/rstd float32 of shape x.shape[:-1]."""
    _checks.floating("layer_norm", "input", x)
    _check_params("layer_norm", x, weight=weight, bias=bias)
    x = x._contiguous_raw()
    rows, cols = _rows(x)
    out = _empty(x.shape, x.dtype, x.device)
    mean, rstd = (_empty(x.shape[:-1], _dt.float32, x.device) for _ in range(2))
    check(lib.it_layernorm_forward(x.device.native, x.dtype.native, out._ptr(), _f32_ptr(mean),
                                   _f32_ptr(rstd), x._ptr(), _ptr_or_null(weight),
                                   _ptr_or_null(bias), rows, cols, eps))
    return out, mean, rstd


@_trace.traced("kernel")
def layer_norm_backward(dout: Tensor, x: Tensor, weight, mean: Tensor, rstd: Tensor,
                        has_bias: bool = True):
    """Returns (dx, dweight, dbias); dweight/dbias are None without affine parameters."""
    _checks.shape_is("layer_norm backward", "grad", dout, x.shape)
    dout, x = dout._contiguous_raw(), x._contiguous_raw()
    rows, cols = _rows(x)
    dx = _empty(x.shape, x.dtype, x.device)
    dw = _empty((cols,), x.dtype, x.device) if weight is not None else None
    db = _empty((cols,), x.dtype, x.device) if weight is not None and has_bias else None
    check(lib.it_layernorm_backward(x.device.native, x.dtype.native, dx._ptr(), _ptr_or_null(dw),
                                    _ptr_or_null(db), dout._ptr(), x._ptr(), _ptr_or_null(weight),
                                    _f32_ptr(mean), _f32_ptr(rstd), rows, cols))
    return dx, dw, db


@_trace.traced("kernel")
def rms_norm(x: Tensor, weight: Tensor | None, eps: float = 1e-6):
    """Returns (out, rstd)."""
    _checks.floating("rms_norm", "input", x)
    _check_params("rms_norm", x, weight=weight)
    x = x._contiguous_raw()
    rows, cols = _rows(x)
    out = _empty(x.shape, x.dtype, x.device)
    rstd = _empty(x.shape[:-1], _dt.float32, x.device)
    check(lib.it_rmsnorm_forward(x.device.native, x.dtype.native, out._ptr(), _f32_ptr(rstd),
                                 x._ptr(), _ptr_or_null(weight), rows, cols, eps))
    return out, rstd


@_trace.traced("kernel")
def rms_norm_backward(dout: Tensor, x: Tensor, weight, rstd: Tensor):
    """Returns (dx, dweight)."""
    _checks.shape_is("rms_norm backward", "grad", dout, x.shape)
    dout, x = dout._contiguous_raw(), x._contiguous_raw()
    rows, cols = _rows(x)
    dx = _empty(x.shape, x.dtype, x.device)
    dw = _empty((cols,), x.dtype, x.device) if weight is not None else None
    check(lib.it_rmsnorm_backward(x.device.native, x.dtype.native, dx._ptr(), _ptr_or_null(dw),
                                  dout._ptr(), x._ptr(), _ptr_or_null(weight), _f32_ptr(rstd),
                                  rows, cols))
    return dx, dw


# ---- softmax ---------------------------------------------------------------------------
def _swap(ndim: int, d: int) -> list:
    dims = list(range(ndim))
    dims[d], dims[-1] = dims[-1], dims[d]
    return dims


def _swap_last(x: Tensor, d: int) -> Tensor:
    """x with dimension d and the last one swapped (a view)."""
    return x._permute_raw(_swap(x.ndim, d))


@_trace.traced("kernel")
def softmax(x: Tensor, dim: int = -1) -> Tensor:
    _checks.floating("softmax", "input", x)
    d = _wrap_dim(dim, x.ndim)
    if x.ndim == 0:
        return softmax(x._reshape_raw((1,)))._reshape_raw(())
    if d != x.ndim - 1:
        return softmax(_swap_last(x, d), -1)._permute_raw(_swap(x.ndim, d))._contiguous_raw()
    if x.numel() == 0:
        return _empty(x.shape, x.dtype, x.device)
    x = x._contiguous_raw()
    rows, cols = _rows(x)
    out = _empty(x.shape, x.dtype, x.device)
    check(lib.it_softmax_forward(x.device.native, x.dtype.native, out._ptr(), x._ptr(), rows, cols))
    return out


@_trace.traced("kernel")
def softmax_backward(dout: Tensor, out: Tensor, dim: int = -1) -> Tensor:
    if out.ndim == 0:
        return softmax_backward(dout._reshape_raw((1,)), out._reshape_raw((1,)))._reshape_raw(())
    d = _wrap_dim(dim, out.ndim)
    if d != out.ndim - 1:
        return softmax_backward(_swap_last(dout, d), _swap_last(out, d)) \
            ._permute_raw(_swap(out.ndim, d))._contiguous_raw()
    _checks.shape_is("softmax backward", "grad", dout, out.shape)
    if out.numel() == 0:
        return _empty(out.shape, out.dtype, out.device)
    dout, out = dout._contiguous_raw(), out._contiguous_raw()
    rows, cols = _rows(out)
    dx = _empty(out.shape, out.dtype, out.device)
    check(lib.it_softmax_backward(out.device.native, out.dtype.native, dx._ptr(), dout._ptr(),
                                  out._ptr(), rows, cols))
    return dx


# ---- cross-entropy ---------------------------------------------------------------------
@_trace.traced("kernel")
def cross_entropy(logits: Tensor, targets: Tensor, vocab: int | None = None,
                  ignore_index: int = -100):
    """Per-row losses and log-sum-exp (both float32, shape [N]) of logits [N, Vp] against
    targets [N]; only the first `vocab` columns (default: all) enter the softmax."""
    _checks.floating("cross_entropy", "logits", logits)
    _checks.index_tensor("cross_entropy", "targets", targets)
    _checks.same_device("cross_entropy", logits=logits, targets=targets)
    if logits.ndim != 2 or targets.shape != (logits.shape[0],):
        raise ValueError(f"cross_entropy: expected logits [N, V] and targets [N], got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    logits, targets = logits._contiguous_raw(), targets._contiguous_raw()
    rows, padded = logits.shape
    vocab = padded if vocab is None else vocab
    losses, lse = (_empty((rows,), _dt.float32, logits.device) for _ in range(2))
    check(lib.it_cross_entropy_forward(logits.device.native, logits.dtype.native,
                                       _f32_ptr(losses), _f32_ptr(lse), logits._ptr(),
                                       targets._ptr(), targets.dtype.native, rows, vocab, padded,
                                       ignore_index))
    return losses, lse


@_trace.traced("kernel")
def cross_entropy_backward(dlosses: Tensor, logits: Tensor, lse: Tensor, targets: Tensor,
                           vocab: int | None = None, ignore_index: int = -100,
                           out: Tensor | None = None) -> Tensor:
    """dlogits; `out` may be logits itself to reuse its memory."""
    rows, padded = logits.shape
    vocab = padded if vocab is None else vocab
    _checks.shape_is("cross_entropy backward", "dlosses", dlosses, (rows,))
    if dlosses.dtype is not _dt.float32:
        raise TypeError(f"cross_entropy backward: dlosses must be float32, got {dlosses.dtype.name}")
    # held in names for the call: a temporary's memory would be freed before the kernel reads it
    logits, dlosses, targets = logits._contiguous_raw(), dlosses._contiguous_raw(), targets._contiguous_raw()
    dlogits = _empty(logits.shape, logits.dtype, logits.device) if out is None else out
    check(lib.it_cross_entropy_backward(logits.device.native, logits.dtype.native, dlogits._ptr(),
                                        logits._ptr(), _f32_ptr(lse), targets._ptr(),
                                        targets.dtype.native, _f32_ptr(dlosses), rows, vocab,
                                        padded, ignore_index))
    return dlogits


# ---- attention -------------------------------------------------------------------------
def _attention_shapes(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"attention: q, k, v must be [B, H, T, D], got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    if k.shape != (B, Hkv, Tk, D) or v.shape != k.shape:
        raise ValueError(f"attention: k and v must be [B, H_kv, T_kv, D] matching q {tuple(q.shape)}, "
                         f"got {tuple(k.shape)} and {tuple(v.shape)}")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"attention: q's {H} heads are not a multiple of k/v's {Hkv} heads")
    if causal and Tk < Tq:
        raise ValueError(f"attention: causal attention needs at least as many keys ({Tk}) as "
                         f"queries ({Tq})")
    return B, H, Hkv, Tq, Tk, D


def _attention_options(bias, dropout_p: float, seed: int, shape: tuple):
    """The it_attention_options of a call (NULL when there is nothing to add) and the tensor
    the bias pointer reads, which must live until the call returns. bias: float32, broadcast to
    shape [B, H, Tq, Tk]."""
    if bias is None and not dropout_p:
        return _NULL, None
    opts = ffi.new("it_attention_options *")
    if bias is not None:
        if bias.dtype != _dt.float32:
            raise TypeError(f"attention: the score bias must be float32, got {bias.dtype}")
        try:
            bias = bias.expand(*shape)
        except (ValueError, RuntimeError) as e:
            raise ValueError(f"attention: a mask of shape {tuple(bias.shape)} does not broadcast "
                             f"to the scores' [B, H, L, S] = {list(shape)}") from e
        if bias.stride()[-1] != 1 and shape[-1] > 1:
            bias = bias.contiguous()
        opts.bias = ffi.cast("float *", bias.data_ptr())
        opts.bias_stride_batch, opts.bias_stride_head, opts.bias_stride_query = bias.stride()[:3]
    opts.dropout_p, opts.seed = float(dropout_p), seed & (2**64 - 1)
    return opts, bias


@_trace.traced("kernel")
def attention(q: Tensor, k: Tensor, v: Tensor, scale: float | None = None, causal: bool = True,
              bias: Tensor | None = None, dropout_p: float = 0.0, seed: int = 0):
    """Returns (out [B, H, Tq, D], lse float32 [B, H, Tq]). k, v: [B, H_kv, Tk, D]; causal
    masks aligned to the bottom right (query i sees keys j <= i + Tk - Tq). bias: float32 added
    to the scaled scores, broadcast to [B, H, Tq, Tk] (-inf masks; a row with every key masked
    gives zeros). dropout_p: dropout on the probabilities, its mask a hash of seed."""
    _checks.floating("attention", "q", q)
    _checks.same_device("attention", q=q, k=k, v=v, bias=bias)
    _checks.same_dtype("attention", q=q, k=k, v=v)
    B, H, Hkv, Tq, Tk, D = _attention_shapes(q, k, v, causal)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    q, k, v = q._contiguous_raw(), k._contiguous_raw(), v._contiguous_raw()
    out = _empty(q.shape, q.dtype, q.device)
    lse = _empty((B, H, Tq), _dt.float32, q.device)
    opts, bias = _attention_options(bias, dropout_p, seed, (B, H, Tq, Tk))
    check(lib.it_attention_forward(q.device.native, q.dtype.native, out._ptr(), _f32_ptr(lse),
                                   q._ptr(), k._ptr(), v._ptr(), B, H, Hkv, Tq, Tk, D, scale,
                                   int(causal), opts))
    return out, lse


@_trace.traced("kernel")
def attention_backward(dout, q, k, v, out, lse, scale: float | None = None, causal: bool = True,
                       bias: Tensor | None = None, dropout_p: float = 0.0, seed: int = 0):
    """Returns (dq, dk, dv). out and lse are the whole rows' (they may span more keys than k:
    then the gradients are this block's part); bias, dropout_p and seed are the forward's."""
    B, H, Hkv, Tq, Tk, D = _attention_shapes(q, k, v, causal)
    _checks.shape_is("attention backward", "grad", dout, q.shape)
    _checks.shape_is("attention backward", "out", out, q.shape)
    _checks.shape_is("attention backward", "lse", lse, (B, H, Tq))
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    # held in names for the call: a temporary's memory would be freed before the kernel reads it
    dout, q, k, v, out, lse = (t._contiguous_raw() for t in (dout, q, k, v, out, lse))
    dq = _empty(q.shape, q.dtype, q.device)
    dk, dv = _empty(k.shape, k.dtype, k.device), _empty(v.shape, v.dtype, v.device)
    opts, bias = _attention_options(bias, dropout_p, seed, (B, H, Tq, Tk))
    check(lib.it_attention_backward(q.device.native, q.dtype.native, dq._ptr(), dk._ptr(),
                                    dv._ptr(), dout._ptr(), q._ptr(), k._ptr(), v._ptr(),
                                    out._ptr(), _f32_ptr(lse), B, H, Hkv, Tq, Tk, D, scale,
                                    int(causal), opts))
    return dq, dk, dv


@_trace.traced("kernel")
def attention_merge(out: Tensor, lse: Tensor, block_out: Tensor, block_lse: Tensor,
                    row_offset: int = 0) -> None:
    """Merges a block's attention (block_out [B, H, Tb, D], block_lse [B, H, Tb]) into the
    float32 running result out [B, H, T, D], lse [B, H, T] at rows [row_offset, row_offset +
    Tb), in place, by the log-sum-exp rule (lse starts at -inf)."""
    B, H, T, D = out.shape
    Tb = block_out.shape[2]
    if out.dtype is not _dt.float32 or lse.dtype is not _dt.float32 \
            or block_lse.dtype is not _dt.float32:
        raise TypeError("attention_merge: out, lse and block_lse must be float32")
    _checks.shape_is("attention_merge", "lse", lse, (B, H, T))
    _checks.shape_is("attention_merge", "block_out", block_out, (B, H, Tb, D))
    _checks.shape_is("attention_merge", "block_lse", block_lse, (B, H, Tb))
    if not (out.is_contiguous() and lse.is_contiguous()):
        raise ValueError("attention_merge: out and lse must be contiguous (they are written in place)")
    block_out, block_lse = block_out._contiguous_raw(), block_lse._contiguous_raw()
    check(lib.it_attention_merge(out.device.native, block_out.dtype.native, _f32_ptr(out),
                                 _f32_ptr(lse), block_out._ptr(), _f32_ptr(block_lse), B * H, T,
                                 Tb, row_offset, D))


# ---- rotary embedding ------------------------------------------------------------------
def _rope(fn, name, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    _checks.floating(name, "input", x)
    if x.ndim != 4:
        raise ValueError(f"{name}: x must be [B, T, H, D], got {tuple(x.shape)}")
    B, T, H, D = x.shape
    for n, t in (("cos", cos), ("sin", sin)):
        if t.dtype is not _dt.float32:
            raise TypeError(f"{name}: {n} must be float32, got {t.dtype.name}")
        if t.ndim != 2 or t.shape[0] < T or t.shape[1] != D // 2:
            raise ValueError(f"{name}: {n} must be [>= {T}, {D // 2}], got {tuple(t.shape)}")
        _checks.same_device(name, x=x, **{n: t})
    x, cos, sin = x._contiguous_raw(), cos._contiguous_raw(), sin._contiguous_raw()
    out = _empty(x.shape, x.dtype, x.device)
    check(fn(x.device.native, x.dtype.native, out._ptr(), x._ptr(), _f32_ptr(cos),
             _f32_ptr(sin), B, T, H, D))
    return out


@_trace.traced("kernel")
def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotates interleaved pairs of x [B, T, H, D] by angles with cos/sin [T, D/2]."""
    return _rope(lib.it_rope_forward, "rope", x, cos, sin)


@_trace.traced("kernel")
def rope_backward(dout: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return _rope(lib.it_rope_backward, "rope backward", dout, cos, sin)


# ---- embedding -------------------------------------------------------------------------
@_trace.traced("kernel")
def embedding(weight: Tensor, indices: Tensor) -> Tensor:
    """weight [V, C] rows picked by indices (any shape) -> indices.shape + [C]."""
    _checks.index_tensor("embedding", "indices", indices)
    _checks.same_device("embedding", weight=weight, indices=indices)
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be [num_embeddings, dim], got {tuple(weight.shape)}")
    weight, indices = weight._contiguous_raw(), indices._contiguous_raw()
    V, C = weight.shape
    out = _empty(indices.shape + (C,), weight.dtype, weight.device)
    check(lib.it_embedding_forward(weight.device.native, weight.dtype.native, out._ptr(),
                                   indices._ptr(), indices.dtype.native, weight._ptr(),
                                   indices.numel(), V, C))
    return out


@_trace.traced("kernel")
def embedding_backward(dweight: Tensor, dout: Tensor, indices: Tensor) -> Tensor:
    """dweight[indices[n]] += dout[n]; returns dweight."""
    _checks.index_tensor("embedding backward", "indices", indices)
    _checks.same_dtype("embedding backward", dweight=dweight, grad=dout)
    V, C = dweight.shape
    _checks.shape_is("embedding backward", "grad", dout, indices.shape + (C,))
    if not dweight.is_contiguous():
        raise ValueError("embedding backward: dweight must be contiguous")
    dout, indices = dout._contiguous_raw(), indices._contiguous_raw()
    check(lib.it_embedding_backward(dweight.device.native, dweight.dtype.native, dweight._ptr(),
                                    dout._ptr(), indices._ptr(), indices.dtype.native,
                                    indices.numel(), V, C))
    return dweight
