"""Differentiable arithmetic, unary functions, reductions, matmul and softmax."""
from __future__ import annotations

import numbers

from .. import amp
from .._native import lib
from ..autograd import Function
from ..kernels import elementwise as ew
from ..kernels import nn as knn
from ..tensor import Tensor


def sum_to(g: Tensor, shape: tuple) -> Tensor:
    """Sums a broadcast gradient back down to `shape`."""
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g
    lead = g.ndim - len(shape)
    dims = list(range(lead)) + [lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1]
    out = ew.reduce(lib.IT_SUM, g, dims, keepdim=True) if dims else g
    return out.reshape(shape)


def _shape(x):
    return x.shape if isinstance(x, Tensor) else None


class Add(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = (a.shape, _shape(b))
        return ew.add(a, b)

    @staticmethod
    def backward(ctx, g):
        sa, sb = ctx.shapes
        return sum_to(g, sa), (sum_to(g, sb) if sb is not None else None)


class Sub(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = (a.shape, _shape(b))
        return ew.sub(a, b)

    @staticmethod
    def backward(ctx, g):
        sa, sb = ctx.shapes
        return sum_to(g, sa), (sum_to(-g, sb) if sb is not None else None)


class RSub(Function):  # s - a
    @staticmethod
    def forward(ctx, a, s):
        return ew.rsub(a, s)

    @staticmethod
    def backward(ctx, g):
        return -g, None


class Mul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b if isinstance(b, Tensor) else None)
        ctx.scalar = None if isinstance(b, Tensor) else b
        return ew.mul(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        if b is None:
            return ew.mul(g, ctx.scalar), None
        ga = sum_to(ew.mul(g, b), a.shape) if ctx.needs_input_grad[0] else None
        gb = sum_to(ew.mul(g, a), b.shape) if ctx.needs_input_grad[1] else None
        return ga, gb


class Div(Function):
    @staticmethod
    def forward(ctx, a, b):
        out = ew.div(a, b)
        if isinstance(b, Tensor):
            ctx.save_for_backward(a, b, out)
        ctx.scalar = None if isinstance(b, Tensor) else b
        ctx.shape_a = a.shape
        return out

    @staticmethod
    def backward(ctx, g):
        if ctx.scalar is not None:
            return ew.div(g, ctx.scalar), None
        a, b, out = ctx.saved_tensors
        ga = sum_to(ew.div(g, b), a.shape) if ctx.needs_input_grad[0] else None
        gb = sum_to(-ew.div(ew.mul(g, out), b), b.shape) if ctx.needs_input_grad[1] else None
        return ga, gb


class RDiv(Function):  # s / a
    @staticmethod
    def forward(ctx, a, s):
        out = ew.rdiv(a, s)
        ctx.save_for_backward(a, out)
        return out

    @staticmethod
    def backward(ctx, g):
        a, out = ctx.saved_tensors
        return -ew.div(ew.mul(g, out), a), None


class PowScalar(Function):
    @staticmethod
    def forward(ctx, a, s):
        ctx.save_for_backward(a)
        ctx.s = s
        return ew.pow(a, s)

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        return ew.mul(ew.mul(g, ew.pow(a, ctx.s - 1)), ctx.s), None


# Unary ops whose backward kernel wants the output rather than the input.
_SAVES_OUTPUT = {lib.IT_EXP, lib.IT_SQRT, lib.IT_TANH, lib.IT_SIGMOID}


class Unary(Function):
    @staticmethod
    def forward(ctx, x, op):
        out = ew.unary(op, x)
        ctx.op = op
        ctx.save_for_backward(out if op in _SAVES_OUTPUT else x)
        return out

    @staticmethod
    def backward(ctx, g):
        (saved,) = ctx.saved_tensors
        return ew.unary_backward(ctx.op, g.contiguous(), saved), None


class Clamp(Function):
    @staticmethod
    def forward(ctx, x, low, high):
        out = x
        if low is not None:
            out = ew.scalar(lib.IT_SCALAR_MAX, out, low)
        if high is not None:
            out = ew.scalar(lib.IT_SCALAR_MIN, out, high)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        # d/dx is 1 where x was not clamped: (out == x) computed as 1 - min(|out - x| * big, 1)
        inside = ew.rsub(ew.scalar(lib.IT_SCALAR_MIN, ew.mul(ew.unary(lib.IT_ABS, ew.sub(out, x)), 1e30), 1.0), 1.0)
        return ew.mul(g, inside), None, None


class SwiGLU(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return ew.swiglu(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return ew.swiglu_backward(g, a, b)


class Sum(Function):
    @staticmethod
    def forward(ctx, x, dim, keepdim, mean):
        ctx.shape = x.shape
        ctx.dims = None if dim is None else ew._dims(x, dim)
        ctx.keepdim = keepdim
        ctx.count = x.numel() if dim is None else 1
        if dim is not None:
            for d in ctx.dims:
                ctx.count *= x.shape[d]
        ctx.mean = mean
        return ew.reduce(lib.IT_MEAN if mean else lib.IT_SUM, x, dim, keepdim)

    @staticmethod
    def backward(ctx, g):
        if ctx.dims is None:
            g = g.reshape((1,) * len(ctx.shape))
        elif not ctx.keepdim:
            for d in sorted(ctx.dims):
                g = g.unsqueeze(d)
        if ctx.mean:
            g = ew.div(g, ctx.count)
        return g.expand(ctx.shape), None, None, None


class Matmul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return ew.matmul(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        a2 = a.unsqueeze(0) if a.ndim == 1 else a
        b2 = b.unsqueeze(-1) if b.ndim == 1 else b
        if a.ndim == 1:
            g = g.unsqueeze(-2)
        if b.ndim == 1:
            g = g.unsqueeze(-1)
        ga = sum_to(ew.matmul(g, b2.transpose(-1, -2)), a2.shape).reshape(a.shape) \
            if ctx.needs_input_grad[0] else None
        gb = None
        if ctx.needs_input_grad[1]:
            if b2.ndim == 2 and a2.ndim > 2:  # fold the batch into one product
                gb = ew.matmul(a2.reshape(-1, a2.shape[-1]).transpose(0, 1), g.reshape(-1, g.shape[-1]))
            else:
                gb = sum_to(ew.matmul(a2.transpose(-1, -2), g), b2.shape)
            gb = gb.reshape(b.shape)
        return ga, gb


class Softmax(Function):
    @staticmethod
    def forward(ctx, x, dim):
        out = knn.softmax(x, dim)
        ctx.save_for_backward(out)
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        return knn.softmax_backward(g, out, ctx.dim), None


# ---- entry points used by Tensor's operators ---------------------------------------------
def _promote(a, b):
    """Mixed float dtypes compute in the wider one (float32), as PyTorch's type promotion."""
    if isinstance(b, Tensor) and a.dtype is not b.dtype and a.dtype.is_floating_point \
            and b.dtype.is_floating_point:
        if a.dtype.itemsize < b.dtype.itemsize or b.dtype.name == "float32":
            a = a.to(b.dtype)
        else:
            b = b.to(a.dtype)
    return a, b


def add(a, b):
    return Add.apply(*_promote(a, b))


def sub(a, b):
    return Sub.apply(*_promote(a, b))


def rsub(a, s):
    return RSub.apply(a, s)


def mul(a, b):
    return Mul.apply(*_promote(a, b))


def div(a, b):
    return Div.apply(*_promote(a, b))


def rdiv(a, s):
    return RDiv.apply(a, s)


def pow(a, b):  # noqa: A001
    if isinstance(b, numbers.Real):
        return PowScalar.apply(a, b)
    if a.requires_grad or b.requires_grad:
        raise NotImplementedError("tensor ** tensor is not differentiable yet; use (b * a.log()).exp()")
    return ew.pow(a, b)


def unary(op, x):
    return Unary.apply(x, op)


def matmul(a, b):
    return Matmul.apply(*amp.lower(a, b))


def sum(x, dim=None, keepdim=False):  # noqa: A001
    return Sum.apply(x, dim, keepdim, False)


def mean(x, dim=None, keepdim=False):
    return Sum.apply(x, dim, keepdim, True)


def softmax(x, dim=-1):
    return Softmax.apply(*amp.full(x), dim)


def clamp(x, low=None, high=None):
    return Clamp.apply(x, low, high)


def swiglu(a, b):
    return SwiGLU.apply(a, b)
