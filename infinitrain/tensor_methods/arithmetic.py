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

    def __pow__(self, other):
        return _ops.pow(self, other)

    def __rpow__(self, other):
        return _ops.rpow(self, other)

    def __neg__(self):
        return _ops.unary(lib.IT_NEG, self) if self.dtype.is_floating_point else _ops.mul(self, -1)

    def neg(self):
        return -self

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
