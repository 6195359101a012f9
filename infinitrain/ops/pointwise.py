"""Elementwise functions made from the native kernels rather than one of their own: log1p,
expm1, log2, log10, erf, the roundings (round, floor, ceil, trunc, frac), isnan / isinf /
isfinite. Each is written so that it keeps float32's accuracy where the plain formula would
not (log(1 + x) for a tiny x), and its gradient is PyTorch's."""
from __future__ import annotations

import math

from .. import dtypes as _dt
from ..autograd import Function
from ..tensor import Tensor
from . import index as _idx
from .math import cast


def _floating(x: Tensor) -> Tensor:
    return x if x.dtype.is_floating_point else cast(x, _dt.float32)


class Log1p(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        u = x + 1
        # log(u) * x / (u - 1) cancels the rounding of 1 + x (Goldberg); where u rounds to 1, x itself
        out = _idx.where(u == 1, x, u.log() * (x / (u - 1)))
        return _idx.where(x == math.inf, x, out)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g / (x + 1)


class Expm1(Function):
    @staticmethod
    def forward(ctx, x):
        u = x.exp()
        ctx.save_for_backward(u)
        # (u - 1) * x / log(u) cancels the rounding of exp(x) (Kahan); where u rounds to 1, x itself
        out = _idx.where(u == 1, x, (u - 1) * (x / u.log()))
        out = _idx.where(u - 1 == -1, u - 1, out)
        return _idx.where(u == math.inf, u, out)

    @staticmethod
    def backward(ctx, g):
        (u,) = ctx.saved_tensors
        return g * u


# erf(x) for |x| < 0.5: 2/sqrt(pi) * (x - x^3/3 + x^5/10 - ...), seven terms (error < 1e-9);
# beyond: Abramowitz & Stegun 7.1.26, 1 - t (a1 + t (a2 + ...)) exp(-x^2), t = 1 / (1 + p |x|)
# (error < 1.5e-7 where erf > 0.52). float64 inputs get this float32-level accuracy too.
_SERIES = [2 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(7)]
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


class Erf(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        small = x.clamp(-0.5, 0.5)
        sq = small * small
        series = sq * 0 + _SERIES[-1]
        for c in reversed(_SERIES[:-1]):
            series = series * sq + c
        series = series * small
        a = x.abs()
        t = 1 / (a * _AS_P + 1)
        poly = t * 0 + _AS_A[-1]
        for c in reversed(_AS_A[:-1]):
            poly = poly * t + c
        tail = 1 - poly * t * (-(a * a)).exp()
        return _idx.where(a < 0.5, series, tail * x.sign())

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (-(x * x)).exp() * (2 / math.sqrt(math.pi))


class Rounding(Function):
    """round (half to even), floor, ceil, trunc: piecewise constant, so the gradient is zero
    (PyTorch's), but the result stays in the graph."""

    @staticmethod
    def forward(ctx, x, mode):
        ctx.meta = (x.shape, x.dtype, x.device)
        return _rounded(x, mode)

    @staticmethod
    def backward(ctx, g):
        from .math import _zeros
        return _zeros(*ctx.meta), None


def _rounded(x: Tensor, mode: str) -> Tensor:
    if not x.dtype.is_floating_point:
        return x.clone()
    if x.dtype.itemsize < 4:  # 16-bit floats: their integers are exact in float32
        return cast(_rounded(cast(x, _dt.float32), mode), x.dtype)
    # |x| + 2^(mantissa bits) has no fraction bits left, so the addition rounds |x| to the nearest
    # integer, ties to even; |x| at or above it is a whole number already (inf and nan included)
    big = 2.0 ** (52 if x.dtype is _dt.float64 else 23)
    a = x.abs()
    r = _idx.where(a < big, ((a + big) - big) * x.sign(), x)
    if mode == "round":
        return r
    floor = r - (r > x).to(dtype=x.dtype)
    if mode == "floor":
        return floor
    ceil = r + (r < x).to(dtype=x.dtype)
    if mode == "ceil":
        return ceil
    return _idx.where(x >= 0, floor, ceil)  # trunc


# ---- entry points --------------------------------------------------------------------------
def _in_float32(fn, x: Tensor) -> Tensor:
    """fn of x, worked out in float32 for a 16-bit x (its several steps would each round to 8 or
    11 bits) and rounded once at the end, as PyTorch's kernels do."""
    x = _floating(x)
    if x.dtype.itemsize < 4:
        return cast(fn(cast(x, _dt.float32)), x.dtype)
    return fn(x)


def log1p(x: Tensor) -> Tensor:
    return _in_float32(Log1p.apply, x)


def expm1(x: Tensor) -> Tensor:
    return _in_float32(Expm1.apply, x)


def erf(x: Tensor) -> Tensor:
    return _in_float32(Erf.apply, x)


def rounding(x: Tensor, mode: str, decimals: int = 0) -> Tensor:
    if decimals:
        if mode != "round":
            raise ValueError(f"decimals is an argument of round(), not {mode}()")
        scale = 10.0 ** decimals
        return Rounding.apply(x * scale, mode) / scale
    return Rounding.apply(x, mode)


def frac(x: Tensor) -> Tensor:
    """x - trunc(x), whose gradient is 1 (the truncation's is 0)."""
    if not x.dtype.is_floating_point:
        raise TypeError(f"frac() is defined for floating-point tensors, not {x.dtype.name}")
    return x - _rounded(x.detach(), "trunc")


def isnan(x: Tensor) -> Tensor:
    return x.detach() != x.detach()


def isinf(x: Tensor) -> Tensor:
    if not x.dtype.is_floating_point:
        return x.detach() != x.detach()  # all False
    return x.detach().abs() == math.inf


def isfinite(x: Tensor) -> Tensor:
    if not x.dtype.is_floating_point:
        return x.detach() == x.detach()  # all True
    d = x.detach()
    return (d - d) == 0  # inf - inf and nan - nan are nan
