"""Differentiable views and copies: reshape, permute, expand, indexing, concatenation."""
from __future__ import annotations

from .. import dtypes as _dt
from ..autograd import Function
from ..kernels import memory
from ..tensor import Tensor, _empty, _wrap_dim
from .math import cast, sum_to


class Reshape(Function):  # view, reshape, flatten, squeeze, unsqueeze
    makes_view = True  # its output may share its input's memory (see Function.apply)

    @staticmethod
    def forward(ctx, x, shape):
        ctx.shape = x.shape
        return x._reshape_raw(shape)

    @staticmethod
    def backward(ctx, g):
        return g._contiguous_raw()._reshape_raw(ctx.shape), None


class View(Function):  # view / reshape of a tensor whose strides allow it (split pieces included)
    makes_view = True  # its output shares its input's memory (see Function.apply)

    @staticmethod
    def forward(ctx, x, shape, strides):
        ctx.shape = x.shape
        return x._view(shape, strides)

    @staticmethod
    def backward(ctx, g):
        return g._contiguous_raw()._reshape_raw(ctx.shape), None, None


class Permute(Function):  # transpose, permute, t
    makes_view = True  # its output may share its input's memory (see Function.apply)

    @staticmethod
    def forward(ctx, x, dims):
        ctx.inverse = tuple(sorted(range(len(dims)), key=lambda i: dims[i]))
        return x._permute_raw(dims)

    @staticmethod
    def backward(ctx, g):
        return g._permute_raw(ctx.inverse), None


class Expand(Function):
    makes_view = True  # its output may share its input's memory (see Function.apply)

    @staticmethod
    def forward(ctx, x, shape):
        ctx.shape = x.shape
        return x._expand_raw(shape)

    @staticmethod
    def backward(ctx, g):
        return sum_to(g, ctx.shape), None


class Index(Function):  # slicing, select, narrow, split pieces
    makes_view = True  # its output may share its input's memory (see Function.apply)

    @staticmethod
    def forward(ctx, x, key):
        ctx.meta = (x.shape, x.dtype, x.device)
        ctx.key = key
        return x._getitem_raw(key)

    @staticmethod
    def backward(ctx, g):
        shape, dtype, device = ctx.meta
        out = _empty(shape, dtype, device)
        memory.copy_into(out, 0)
        memory.copy_into(out._getitem_raw(ctx.key), g)
        return out, None


class Clone(Function):  # contiguous() of a strided tensor, clone()
    @staticmethod
    def forward(ctx, x):
        return x._clone_raw()

    @staticmethod
    def backward(ctx, g):
        return g


class Cat(Function):
    @staticmethod
    def forward(ctx, dim, *tensors):
        ctx.dim = dim
        ctx.sizes = [t.shape[dim] for t in tensors]
        return memory.cat(tensors, dim)

    @staticmethod
    def backward(ctx, g):
        return (None,) + tuple(memory.split_copy(g, ctx.sizes, ctx.dim))


def cat(tensors, dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat() needs at least one tensor")
    if any(not isinstance(t, Tensor) for t in tensors):
        raise TypeError("cat() takes a sequence of tensors")
    if tensors[0].ndim == 0:
        raise ValueError("cat(): zero-dimensional tensors cannot be concatenated; use stack()")
    d = _wrap_dim(dim, tensors[0].ndim)
    dt = tensors[0].dtype
    for t in tensors[1:]:
        dt = _dt.promote_types(dt, t.dtype)
    return Cat.apply(d, *(cast(t, dt) for t in tensors))


def stack(tensors, dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack() needs at least one tensor")
    d = _wrap_dim(dim, tensors[0].ndim + 1)
    for i, t in enumerate(tensors[1:], 1):
        if t.shape != tensors[0].shape:
            raise ValueError(f"stack(): tensors[{i}] has shape {tuple(t.shape)} but tensors[0] "
                             f"has {tuple(tensors[0].shape)}; stack needs equal shapes")
    return cat([Reshape.apply(t, t.shape[:d] + (1,) + t.shape[d:]) for t in tensors], d)
