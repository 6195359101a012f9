"""Vector norms (torch.linalg.vector_norm, torch.norm, Tensor.norm) with PyTorch's gradient:
zero where the norm is zero, and shared evenly by the ties of an inf-norm."""
from __future__ import annotations

import math

from .. import dtypes as _dt
from ..autograd import Function
from ..kernels import reduce as kred
from ..tensor import Tensor
from . import index as _idx
from .math import _zeros, cast


def _keepdim(t: Tensor, shape: tuple, dims: list) -> Tensor:
    """t (reduced over dims, with or without keepdim) in the keepdim shape."""
    return t.reshape(tuple(1 if i in dims else n for i, n in enumerate(shape)))


class VectorNorm(Function):
    @staticmethod
    def forward(ctx, x, ord, dim, keepdim):  # noqa: A002
        dims = kred.reduce_dims(x, dim) if x.ndim else []
        over = dims or None  # (a 0-d x: its one element)
        a = x.abs()
        if ord == math.inf or ord == -math.inf:
            out = a.amax(over, keepdim) if ord > 0 else a.amin(over, keepdim)
        elif ord == 0:
            out = (x != 0).to(dtype=x.dtype).sum(over, keepdim)
        elif ord == 1:
            out = a.sum(over, keepdim)
        elif ord == 2:
            out = (x * x).sum(over, keepdim).sqrt()
        else:
            out = (a ** ord).sum(over, keepdim) ** (1.0 / ord)
        ctx.save_for_backward(x, out)
        ctx.meta = (ord, dims)
        return out

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        ord, dims = ctx.meta
        if ord == 0:
            return _zeros(x.shape, x.dtype, x.device), None, None, None
        g, out = _keepdim(g, x.shape, dims), _keepdim(out, x.shape, dims)
        zero = _zeros((), x.dtype, x.device)
        if ord == 1:
            return g * x.sign(), None, None, None
        if ord == math.inf or ord == -math.inf:
            hit = (x.abs() == out).to(dtype=x.dtype)
            share = g / hit.sum(dims or None, keepdim=True)
            return hit * share * x.sign(), None, None, None
        if ord == 2:
            scaled = x / out
        else:
            scaled = x.sign() * x.abs() ** (ord - 1) / out ** (ord - 1)
        return _idx.where(out == 0, zero, g * scaled), None, None, None


def vector_norm(x: Tensor, ord=2, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:  # noqa: A002
    if not isinstance(ord, (int, float)) or isinstance(ord, bool):
        raise TypeError(f"vector_norm: ord must be a number, got {ord!r}")
    if dtype is not None:
        x = cast(x, _dt.as_dtype(dtype))
    if not x.dtype.is_floating_point:
        raise TypeError(f"vector_norm: expected a floating-point input, got {x.dtype.name}")
    if isinstance(dim, list):
        dim = tuple(dim)
    return VectorNorm.apply(x, float(ord), dim, keepdim)


def matrix_norm(x: Tensor, ord="fro", dim=(-2, -1), keepdim: bool = False, *, dtype=None) -> Tensor:  # noqa: A002
    """'fro', 1, -1, inf and -inf (the spectral and nuclear norms need an SVD, which infinitrain has not)."""
    if x.ndim < 2:
        raise ValueError(f"matrix_norm: expected a tensor with 2 or more dimensions, got {x.ndim}")
    d0, d1 = (d % x.ndim for d in dim)
    if d0 == d1:
        raise ValueError(f"matrix_norm: dims must be different, got {tuple(dim)}")
    if ord == "fro":
        return vector_norm(x, 2, (d0, d1), keepdim, dtype=dtype)
    if ord in (1, -1, math.inf, -math.inf):
        # 1: the largest column sum of |x| (over d0), inf: the largest row sum (over d1)
        over, across = (d0, d1) if abs(ord) == 1 else (d1, d0)
        sums = vector_norm(x, 1, over, True, dtype=dtype)
        out = sums.amax(across, True) if ord > 0 else sums.amin(across, True)
        return out if keepdim else out.squeeze(max(d0, d1)).squeeze(min(d0, d1))
    raise NotImplementedError(f"matrix_norm: ord={ord!r} is not implemented ('fro', 1, -1, inf, -inf are)")
