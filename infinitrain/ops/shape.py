"""Differentiable views and copies: reshape, permute, expand, indexing, concatenation."""
from __future__ import annotations

from ..autograd import Function
from ..kernels import memory
from ..tensor import Tensor, _empty
from .math import sum_to


class Reshape(Function):  # view, reshape, flatten, squeeze, unsqueeze
    @staticmethod
    def forward(ctx, x, shape):
        ctx.shape = x.shape
        return x._reshape_raw(shape)

    @staticmethod
    def backward(ctx, g):
        return g.reshape(ctx.shape), None


class Permute(Function):  # transpose, permute, t
    @staticmethod
    def forward(ctx, x, dims):
        ctx.inverse = tuple(sorted(range(len(dims)), key=lambda i: dims[i]))
        return x._permute_raw(dims)

    @staticmethod
    def backward(ctx, g):
        return g.permute(*ctx.inverse), None


class Expand(Function):
    @staticmethod
    def forward(ctx, x, shape):
        ctx.shape = x.shape
        return x._expand_raw(shape)

    @staticmethod
    def backward(ctx, g):
        return sum_to(g, ctx.shape), None


class Index(Function):  # slicing, select, narrow, split pieces
    @staticmethod
    def forward(ctx, x, key):
        ctx.meta = (x.shape, x.dtype, x.device)
        ctx.key = key
        return x._getitem_raw(key)

    @staticmethod
    def backward(ctx, g):
        shape, dtype, device = ctx.meta
        out = _empty(shape, dtype, device).fill_(0)
        out._getitem_raw(ctx.key).copy_(g)
        return out, None


class Gather(Function):  # t[index_tensor]: rows along dimension 0
    @staticmethod
    def forward(ctx, x, index):
        ctx.save_for_backward(index)
        ctx.meta = (x.shape, x.dtype, x.device)
        return x._index_select_raw(index)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        shape, dtype, device = ctx.meta
        from ..kernels import nn
        rows = _empty((shape[0], int(_prod(shape[1:]))), dtype, device).fill_(0)
        nn.embedding_backward(rows, g.reshape(index.numel(), -1), index.reshape(-1))
        return rows.view(shape), None


def _prod(xs):
    out = 1
    for n in xs:
        out *= n
    return out


class Clone(Function):  # contiguous() of a strided tensor, clone()
    @staticmethod
    def forward(ctx, x):
        return x._clone_raw()

    @staticmethod
    def backward(ctx, g):
        return g


class Convert(Function):  # to(dtype)
    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = x.dtype
        return memory.convert(x, dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        return (g if g.dtype is ctx.dtype else memory.convert(g, ctx.dtype, g.device)), None


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
    d = dim % max(tensors[0].ndim, 1)
    return Cat.apply(d, *tensors)


def stack(tensors, dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack() needs at least one tensor")
    d = dim % (tensors[0].ndim + 1)
    return cat([t.unsqueeze(d) for t in tensors], d)
