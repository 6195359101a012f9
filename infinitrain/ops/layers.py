"""Differentiable neural-network operations, each one fused Function over the native kernels."""
from __future__ import annotations

import math
import sys

from .. import amp
from .. import dtypes as _dt
from .._native import lib
from ..autograd import Function
from ..kernels import elementwise as ew
from ..kernels import reduce as kred
from ..kernels import matmul as kmm
from ..kernels import index as kidx
from ..kernels import neural as knn
from ..kernels.memory import convert
from ..tensor import Tensor, _empty
from .math import Add, sum_to


class Linear(Function):
    weight_inputs = (1, 2)

    @staticmethod
    def forward(ctx, x, weight, bias):
        x2 = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x2, weight)
        ctx.in_shape = x.shape
        ctx.has_bias = bias is not None
        return kmm.linear(x2, weight, bias).reshape(x.shape[:-1] + (weight.shape[0],))

    @staticmethod
    def backward(ctx, g):
        x2, weight = ctx.saved_tensors
        g2 = g.reshape(-1, g.shape[-1])
        gx = kmm.matmul(g2, weight).reshape(ctx.in_shape) if ctx.needs_input_grad[0] else None
        gw = kmm.matmul(g2.t(), x2) if ctx.needs_input_grad[1] else None
        gb = kred.reduce(lib.IT_SUM, g2, 0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb


class AddBias(Add):
    """y + bias, the bias a layer's weight added apart from its product (RowParallelLinear's,
    after the TP sum): the arithmetic of Add, with the bias's gradient deferred to W under
    autograd.defer_weight_grads."""
    weight_inputs = (1,)

    @staticmethod
    def backward(ctx, g):
        sa, sb = ctx.shapes
        return (sum_to(g, sa) if ctx.needs_input_grad[0] else None), \
            (sum_to(g, sb) if ctx.needs_input_grad[1] else None)


def add_bias(y: Tensor, bias: Tensor) -> Tensor:
    return AddBias.apply(y, bias)


def _keep_only_weight_grads(ctx, *grads) -> None:
    """A norm's kernel gives its weights' gradients with the input's: what a deferred W
    (autograd.defer_weight_grads) returns. The saved input and statistics go now, not when W
    has run (unless the graph is kept for another backward), so that a micro-batch whose W
    waits holds only those."""
    if not ctx.retain_graph:
        ctx.release()
    ctx.weight_grads = grads


class LayerNorm(Function):
    # the kernel computes the three gradients together: a deferred W takes the weights' from B
    weight_inputs = (1, 2)

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        out, mean, rstd = knn.layer_norm(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx, g):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = knn.layer_norm_backward(g, x, weight, mean, rstd, ctx.has_bias)
        _keep_only_weight_grads(ctx, dw, db)
        return dx, dw, db, None

    @staticmethod
    def backward_weight(ctx, g):
        return (None, *ctx.weight_grads, None)


class RMSNorm(Function):
    weight_inputs = (1,)  # as LayerNorm's

    @staticmethod
    def forward(ctx, x, weight, eps):
        out, rstd = knn.rms_norm(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx, g):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = knn.rms_norm_backward(g, x, weight, rstd)
        _keep_only_weight_grads(ctx, dw)
        return dx, dw, None

    @staticmethod
    def backward_weight(ctx, g):
        return (None, *ctx.weight_grads, None)


def _memory_held_only_by(t) -> bool:
    """Whether no tensor but t holds t's memory, counting out the tensor t views (its ._base,
    which an in-place write would re-base) when only t still holds that one."""
    base = t._base
    if base is None:  # (references: t._storage, getrefcount's argument)
        return sys.getrefcount(t._storage) <= 2
    # (references to base: t._base, this frame's name, the argument; to the memory: t's and base's)
    return sys.getrefcount(base) <= 3 and sys.getrefcount(t._storage) <= 3


class CrossEntropy(Function):
    """Mean (or sum, or per-row) cross-entropy of logits [N, V'] over the first `vocab` columns."""

    @staticmethod
    def forward(ctx, logits, targets, vocab, ignore_index, reduction):
        losses, lse = knn.cross_entropy(logits, targets, vocab, ignore_index)
        ctx.save_for_backward(logits, lse, targets)
        ctx.vocab, ctx.ignore_index, ctx.reduction = vocab, ignore_index, reduction
        if reduction == "none":
            return losses
        total = losses.sum()
        if reduction == "sum":
            return total
        # counted where the targets are (no host synchronisation on a GPU): with every row
        # ignored the mean is 0 / 0 = NaN, as in PyTorch
        ignore = _empty((), targets.dtype, targets.device).fill_(ignore_index)
        counted = convert(kidx.compare(lib.IT_NE, targets, ignore), total.dtype)
        ctx.count = kred.reduce(lib.IT_SUM, counted)
        return ew.div(total, ctx.count)

    @staticmethod
    def backward(ctx, g):
        logits, lse, targets = ctx.saved_tensors
        n = logits.shape[0]
        if ctx.reduction == "none":
            dlosses = g.float().contiguous()
        else:
            scale = ew.div(g.float(), ctx.count) if ctx.reduction == "mean" else g.float()
            dlosses = ew.add(_empty((n,), lse.dtype, lse.device).fill_(0), scale)  # [n], on the device
        # When nothing but this node still holds the logits (the training loop dropped them),
        # their gradient is written over them, as llm.c does: that saves a logits-sized buffer,
        # the largest of a GPT-2 step. Never for a leaf or a tensor (or a view of its memory)
        # that anyone else still holds: they would see their values change. Never when the
        # graph is kept (retain_graph=True): a second backward reads them again.
        # (references to the tensor: the saved tuple, this frame, getrefcount's argument)
        reuse = not ctx.retain_graph and logits.grad_fn is not None and logits.is_contiguous() \
            and sys.getrefcount(logits) <= 3 and _memory_held_only_by(logits)
        return knn.cross_entropy_backward(dlosses, logits, lse, targets, ctx.vocab,
                                          ctx.ignore_index, out=logits if reuse else None), \
            None, None, None, None


class Embedding(Function):
    weight_inputs = (1,)

    @staticmethod
    def forward(ctx, indices, weight):
        ctx.save_for_backward(indices)
        ctx.weight_meta = (weight.shape, weight.dtype, weight.device)
        return knn.embedding(weight, indices)

    @staticmethod
    def backward(ctx, g):
        (indices,) = ctx.saved_tensors
        if not ctx.needs_input_grad[1]:  # a deferred backward's input part: nothing to do
            return None, None
        shape, dtype, device = ctx.weight_meta
        if dtype is _dt.float32 or dtype is _dt.float64:
            return None, knn.embedding_backward(_empty(shape, dtype, device).fill_(0), g.contiguous(), indices)
        # a 16-bit table's rows are summed in float32 (the kernel rounds its running sum to the
        # table's dtype after every token: a row met often drifts), then rounded once, as PyTorch
        wide = _empty(shape, _dt.float32, device).fill_(0)
        return None, convert(knn.embedding_backward(wide, convert(g, _dt.float32), indices), dtype)


class Attention(Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, bias=None, dropout_p=0.0, seed=0):
        out, lse = knn.attention(q, k, v, scale, causal, bias, dropout_p, seed)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.causal, ctx.extras = scale, causal, (bias, dropout_p, seed)
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = knn.attention_backward(g, q, k, v, out, lse, ctx.scale, ctx.causal, *ctx.extras)
        return dq, dk, dv, None, None, None, None, None


class Rope(Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return knn.rope(x, cos, sin)

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        return knn.rope_backward(g, cos, sin), None, None


class Dropout(Function):
    @staticmethod
    def forward(ctx, x, p, generator):
        from ..random import default_generator
        u = _empty(x.shape, x.dtype, x.device)
        (generator or default_generator).fill_uniform(u)
        # keep = (u >= p): (u - p) scaled far past 1 and clamped to [0, 1] is exactly 0 or 1,
        # since uniform draws are multiples of 2^-24 away from p unless equal to it.
        keep = ew.scalar(lib.IT_SCALAR_MIN, ew.scalar(lib.IT_SCALAR_MAX,
                         ew.mul(ew.sub(u, p), 1e30), 0.0), 1.0)
        mask = ew.mul(keep, 1.0 / (1.0 - p))
        ctx.save_for_backward(mask)
        return ew.mul(x, mask)

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return ew.mul(g, mask), None, None


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    return Linear.apply(*amp.lower(x, weight, bias))


def attention(q, k, v, scale=None, causal: bool = True, bias=None, dropout_p: float = 0.0,
              generator=None):
    """Scaled-dot-product attention, causal (aligned to the bottom right) or over every key;
    bias: a float32 mask added to the scores (-inf: masked out), broadcast to [B, H, L, S];
    dropout_p: dropout on the probabilities, drawn from generator (default: the global one)."""
    q, k, v = amp.lower(q, k, v)
    seed = 0
    if dropout_p:
        from ..random import default_generator
        gen = generator or default_generator
        # the call's stream: the generator's seed and its next B·H·L·S draws
        B, H, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        seed = (gen.seed * 0x9E3779B97F4A7C15 + gen._take(B * H * L * S)) & 0xFFFFFFFFFFFFFFFF
    return Attention.apply(q, k, v, 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale,
                           causal, bias, dropout_p, seed)


def layer_norm(x, weight, bias, eps):
    return LayerNorm.apply(*amp.full(x, weight, bias), eps)


def rms_norm(x, weight, eps):
    return RMSNorm.apply(*amp.full(x, weight), eps)


def cross_entropy(logits, targets, vocab, ignore_index=-100, reduction="mean"):
    """Cross-entropy over the first `vocab` columns; 16-bit logits are read as they are (the
    kernel accumulates in float32), which saves a float32 copy of the largest activation."""
    return CrossEntropy.apply(logits, targets, vocab, ignore_index, reduction)


class SplitHeads(Function):
    """qkv [B, T, 3C] -> q, k, v, each [B, H, T, D] contiguous (one copy each); the backward
    pass writes the three gradients straight into one [B, T, 3C] buffer."""

    @staticmethod
    def forward(ctx, qkv, heads, kv_heads):
        B, T, C3 = qkv.shape
        D = C3 // (heads + 2 * kv_heads)
        ctx.meta = (qkv.shape, qkv.dtype, qkv.device, heads, kv_heads, D)
        x = qkv.contiguous()
        out, at = [], 0
        for h in (heads, kv_heads, kv_heads):
            part = x._getitem_raw((slice(None), slice(None), slice(at, at + h * D)))
            out.append(part._reshape_strided(B, T, h, D)._permute_raw((0, 2, 1, 3))._clone_raw())
            at += h * D
        return tuple(out)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        shape, dtype, device, heads, kv_heads, D = ctx.meta
        B, T, _ = shape
        dqkv = _empty(shape, dtype, device)
        at = 0
        for g, h in ((dq, heads), (dk, kv_heads), (dv, kv_heads)):
            part = dqkv._getitem_raw((slice(None), slice(None), slice(at, at + h * D)))
            part._reshape_strided(B, T, h, D)._permute_raw((0, 2, 1, 3)).copy_(g)
            at += h * D
        return dqkv, None, None


def split_heads(qkv, heads: int, kv_heads: int | None = None):
    return SplitHeads.apply(qkv, heads, heads if kv_heads is None else kv_heads)
