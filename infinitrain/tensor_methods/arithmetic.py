"""Tensor methods of arithmetic and elementwise maths: the operators + - * / // ** @ and unary -,
with their reflected forms, and their named forms (add, sub, mul, div, floor_divide, pow, neg,
matmul, mm, bmm), maximum, minimum, clamp / clip, where, masked_fill, the unary functions (exp,
log, sqrt, rsqrt, abs, tanh, sigmoid, relu, sin, cos, square, reciprocal, sign, log1p, expm1, log2, log10,
erf, the roundings), isnan / isinf / isfinite, outer, tril, triu.
(+= and the other in-place operators are in inplace.py; comparisons in comparison.py.)"""
from __future__ import annotations

import math

from .._native import lib
from ..ops import index as _idx
from ..ops import math as _ops
from ..ops import pointwise as _pw
from ..ops import shape as _shape
from .. import dtypes as _dt
from ..tensor import Tensor


class ArithmeticMethods:
    def __add__(self, other):
        return _ops.add(self, other)

    def __radd__(self, other):
        return _ops.add(self, other)

    def __sub__(self, other):
        return _ops.sub(self, other)

    def __rsub__(self, other):
        return _ops.rsub(self, other)

    def __mul__(self, other):
        return _ops.mul(self, other)

    def __rmul__(self, other):
        return _ops.mul(self, other)

    def __truediv__(self, other):
        return _ops.div(self, other)

    def __rtruediv__(self, other):
        return _ops.rdiv(self, other)

    def __floordiv__(self, other):
        return _idx.floor_divide(self, other)

    def __rfloordiv__(self, other):
        return _idx.rfloor_divide(self, other)

    def floor_divide(self, other):
        return _idx.floor_divide(self, other)

    def remainder(self, other):
        """self - floor(self / other) * other: the sign of other, as Python's % (torch.remainder)."""
        return self - _idx.floor_divide(self, other) * other

    __mod__ = remainder

    def __rmod__(self, other):
        return other - _idx.rfloor_divide(self, other) * self

    def fmod(self, other):
        """self - trunc(self / other) * other: the sign of self, as C's fmod."""
        quotient = (self.detach() / (other.detach() if isinstance(other, Tensor) else other)).trunc()
        floats = isinstance(other, float) or (isinstance(other, Tensor) and other.dtype.is_floating_point)
        if not self.dtype.is_floating_point and not floats:
            quotient = quotient.to(dtype=self.dtype)
        return self - quotient * other

    def __pow__(self, other):
        return _ops.pow(self, other)

    def __rpow__(self, other):
        return _ops.rpow(self, other)

    def __neg__(self):
        return _ops.unary(lib.IT_NEG, self) if self.dtype.is_floating_point else _ops.mul(self, -1)

    def neg(self):
        return -self

    negative = neg

    def positive(self):
        return self

    def __matmul__(self, other):
        return _ops.matmul(self, other)

    def __rmatmul__(self, other):
        return _ops.matmul(other, self)

    def add(self, other, alpha: float = 1.0):
        return _ops.add(self, other if alpha == 1.0 else other * alpha)

    def sub(self, other):
        return _ops.sub(self, other)

    def mul(self, other):
        return _ops.mul(self, other)

    def div(self, other):
        return _ops.div(self, other)

    def pow(self, other):
        return _ops.pow(self, other)

    def matmul(self, other):
        return _ops.matmul(self, other)

    def mm(self, other):
        if self.ndim != 2 or not isinstance(other, Tensor) or other.ndim != 2:
            raise ValueError("mm(): both operands must be 2-D")
        return _ops.matmul(self, other)

    def bmm(self, other):
        if self.ndim != 3 or not isinstance(other, Tensor) or other.ndim != 3 \
                or other.shape[0] != self.shape[0]:
            raise ValueError("bmm(): both operands must be 3-D with the same batch size, got "
                             f"{tuple(self.shape)} and {tuple(getattr(other, 'shape', ()))}")
        return _ops.matmul(self, other)

    def maximum(self, other):
        return _ops.maximum(self, other, True)

    def minimum(self, other):
        return _ops.maximum(self, other, False)

    def clamp(self, min=None, max=None):  # noqa: A002
        return _ops.clamp(self, min, max)

    clip = clamp

    def where(self, condition, other):
        return _idx.where(condition, self, other)

    def masked_fill(self, mask, value):
        return _idx.masked_fill(self, mask, value)

    def exp(self):
        return _ops.unary(lib.IT_EXP, self)

    def log(self):
        return _ops.unary(lib.IT_LOG, self)

    def sqrt(self):
        return _ops.unary(lib.IT_SQRT, self)

    def rsqrt(self):
        return _ops.unary(lib.IT_RSQRT, self)

    def abs(self):
        return _ops.unary(lib.IT_ABS, self)

    def tanh(self):
        return _ops.unary(lib.IT_TANH, self)

    def sigmoid(self):
        return _ops.unary(lib.IT_SIGMOID, self)

    def relu(self):
        return _ops.unary(lib.IT_RELU, self)

    def sin(self):
        return _ops.unary(lib.IT_SIN, self)

    def cos(self):
        return _ops.unary(lib.IT_COS, self)

    def square(self):
        return _ops.unary(lib.IT_SQUARE, self)

    def reciprocal(self):
        return _ops.unary(lib.IT_RECIPROCAL, self)

    def sgn(self):
        return self.sign()

    def sign(self):
        """-1, 0 or 1 in this tensor's dtype (no gradient: it is piecewise constant)."""
        x = self.detach()
        return ((x > 0).to(dtype=self.dtype) - (x < 0).to(dtype=self.dtype))

    def tril(self, diagonal: int = 0):
        return _ops.triangle(self, diagonal, False)

    def triu(self, diagonal: int = 0):
        return _ops.triangle(self, diagonal, True)

    def log1p(self):
        return _pw.log1p(self)

    def expm1(self):
        return _pw.expm1(self)

    def log2(self):
        return self.log() * (1 / math.log(2))

    def log10(self):
        return self.log() * (1 / math.log(10))

    def erf(self):
        return _pw.erf(self)

    def round(self, *, decimals: int = 0):
        return _pw.rounding(self, "round", decimals)

    def floor(self):
        return _pw.rounding(self, "floor")

    def ceil(self):
        return _pw.rounding(self, "ceil")

    def trunc(self):
        return _pw.rounding(self, "trunc")

    fix = trunc

    def frac(self):
        return _pw.frac(self)

    def isnan(self):
        return _pw.isnan(self)

    def isinf(self):
        return _pw.isinf(self)

    def isfinite(self):
        return _pw.isfinite(self)

    def outer(self, vec2):
        if self.ndim != 1 or not isinstance(vec2, Tensor) or vec2.ndim != 1:
            raise ValueError("outer(): both operands must be 1-D, got "
                             f"{tuple(self.shape)} and {tuple(getattr(vec2, 'shape', ()))}")
        return _ops.mul(self.unsqueeze(1), vec2.unsqueeze(0))

    ger = outer

    def tan(self):
        return self.sin() / self.cos()

    def lerp(self, end, weight):
        return self + weight * (end - self)

    def dot(self, other):
        if self.ndim != 1 or not isinstance(other, Tensor) or other.ndim != 1 or other.shape != self.shape:
            raise ValueError("dot(): expected two 1-D tensors of the same size, got "
                             f"{tuple(self.shape)} and {tuple(getattr(other, 'shape', ()))}")
        return (self * other).sum()

    def addmm(self, mat1, mat2, *, beta=1, alpha=1):
        """beta * self + alpha * (mat1 @ mat2); with beta 0, self is not read (its nan stays out)."""
        product = mat1.mm(mat2)
        product = product if alpha == 1 else product * alpha
        return product if beta == 0 else product + (self if beta == 1 else self * beta)

    def diag(self, diagonal: int = 0):
        """A 1-D tensor as the given diagonal of a square matrix, or a 2-D tensor's diagonal."""
        import numpy as np
        from ..creation import tensor, zeros
        if self.ndim == 2:
            rows, cols = self.shape
            i = np.arange(max(0, -diagonal), min(rows, cols - diagonal))
            flat = i * cols + i + diagonal
            return self.reshape(-1).index_select(0, tensor(flat, dtype=_dt.int64, device=self.device))
        if self.ndim != 1:
            raise ValueError(f"diag(): expected a 1-D or 2-D tensor, got {self.ndim}-D")
        k, n = abs(diagonal), self.shape[0]
        pad = zeros(k, dtype=self.dtype, device=self.device)
        # entry (i, j) of the result is column value j of v shifted by the diagonal, kept where j - i = diagonal
        columns = self.unsqueeze(0) if k == 0 else \
            _shape.cat([pad, self] if diagonal > 0 else [self, pad], 0).unsqueeze(0)
        mask = tensor(np.eye(n + k, k=diagonal), dtype=self.dtype, device=self.device)
        return mask * columns

    def logical_and(self, other):
        return self.bool() & other.bool()

    def logical_or(self, other):
        return self.bool() | other.bool()

    def logical_xor(self, other):
        return self.bool() != other.bool()

    def count_nonzero(self, dim=None):
        return (self != 0).long().sum(dim)

    def masked_select(self, mask):
        """The elements where mask (broadcast with self) is True, as a 1-D tensor."""
        from ..kernels.elementwise import broadcast_shapes
        shape = broadcast_shapes(self.shape, mask.shape)
        return self.expand(shape)[mask.expand(shape)]

    def bernoulli(self, p=None, *, generator=None):
        """1 with probability self (or p), else 0, in self's dtype."""
        from ..creation import rand
        draws = rand(self.shape, generator=generator, device=self.device)
        return (draws < (self.detach() if p is None else p)).to(dtype=self.dtype)

    absolute = abs
    multiply = mul
    subtract = sub
    divide = div
    true_divide = div

    def exp2(self):
        return _ops.rpow(self, 2.0)

    def clamp_min(self, min):  # noqa: A002
        return _ops.clamp(self, min, None)

    def clamp_max(self, max):  # noqa: A002
        return _ops.clamp(self, None, max)
