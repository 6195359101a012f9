"""Differentiable reductions: sum and mean, max/min over everything or dims (amax/amin), and
max/min along one dim with their indices."""
from __future__ import annotations

from .._native import lib
from ..autograd import Function
from ..kernels import elementwise as ew
from ..kernels import index as kidx
from ..kernels import reduce as kred
from ..kernels.memory import convert
from .math import _zeros


def _keepdim_shape(shape: tuple, dims: list) -> tuple:
    return tuple(1 if i in dims else n for i, n in enumerate(shape))


class Sum(Function):
    @staticmethod
    def forward(ctx, x, dim, keepdim, mean):
        ctx.shape = x.shape
        ctx.dims = kred.reduce_dims(x, dim)
        ctx.count = 1
        for d in ctx.dims:
            ctx.count *= x.shape[d]
        ctx.mean = mean
        return kred.reduce(lib.IT_MEAN if mean else lib.IT_SUM, x, dim, keepdim)

    @staticmethod
    def backward(ctx, g):
        g = g._contiguous_raw()._reshape_raw(_keepdim_shape(ctx.shape, ctx.dims))
        if ctx.mean:
            g = ew.div(g, ctx.count)
        return g._expand_raw(ctx.shape), None, None, None


class Extreme(Function):
    """max()/min() over all elements, amax/amin over dims: the gradient is shared evenly by
    the elements equal to the result (as PyTorch does)."""

    @staticmethod
    def forward(ctx, x, dim, keepdim, largest):
        out = kred.reduce(lib.IT_MAX if largest else lib.IT_MIN, x, dim, keepdim)
        ctx.dims = kred.reduce_dims(x, dim)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        kshape = _keepdim_shape(x.shape, ctx.dims)
        hit = convert(kidx.compare(lib.IT_EQ, x, out._contiguous_raw()._reshape_raw(kshape)), g.dtype)
        count = kred.reduce(lib.IT_SUM, hit, ctx.dims, keepdim=True)
        share = ew.div(g._contiguous_raw()._reshape_raw(kshape), count)
        return ew.mul(hit, share), None, None, None


class ExtremeDim(Function):
    """max(dim)/min(dim) -> (values, indices); the gradient goes to the chosen index."""

    @staticmethod
    def forward(ctx, x, dim, keepdim, largest):
        d = kred.reduce_dims(x, dim)[0] if x.ndim else 0
        values = kred.reduce(lib.IT_MAX if largest else lib.IT_MIN, x, dim, keepdim=True)
        indices = kred.arg_extreme(x, dim, keepdim=True, largest=largest)
        ctx.save_for_backward(indices)
        ctx.meta = (x.shape, d)
        if not keepdim and x.ndim:
            values, indices = values._squeeze_raw(d), indices._squeeze_raw(d)
        return values, indices

    @staticmethod
    def backward(ctx, g, _g_indices):
        (indices,) = ctx.saved_tensors
        shape, d = ctx.meta
        out = _zeros(shape, g.dtype, g.device)
        if not shape:
            return ew.add(out, g), None, None, None
        g = g._contiguous_raw()._reshape_raw(indices.shape)
        return kidx.scatter_add(out, d, indices, g), None, None, None


# ---- entry points used by Tensor's methods and the top-level functions ---------------------
def sum(x, dim=None, keepdim=False):  # noqa: A001
    return Sum.apply(x, dim, keepdim, False)


def mean(x, dim=None, keepdim=False):
    return Sum.apply(x, dim, keepdim, True)


def extreme(x, dim=None, keepdim=False, largest=True):
    """max()/min(): over everything (dim None) a tensor, over one int dim (values, indices)."""
    if isinstance(dim, int):
        return ExtremeDim.apply(x, dim, keepdim, largest)
    return Extreme.apply(x, dim, keepdim, largest)


def amax(x, dim=(), keepdim=False, largest=True):
    return Extreme.apply(x, None if dim in ((), None) else dim, keepdim, largest)
