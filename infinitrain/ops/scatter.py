"""Differentiable scatter, scatter_add and index_add (torch.scatter / scatter_add / index_add and
the Tensor methods, whose in-place forms are in tensor_methods/inplace.py), built on the native
scatter-add and index-add kernels.

PyTorch's index may be smaller than src in every dimension and smaller than self in every
dimension but `dim`; the kernels want an index of the output's shape but along dim and a src of
the index's shape, so the work is done on the matching corner of each (out[:i0, ..., :, ..., :ik])
and written back. scatter (replacing, not adding) is a where() over the positions the index hits;
where two src elements go to one position (PyTorch leaves the winner unspecified) the last one
along the index wins, as on PyTorch's CPU, resolved on the host."""
from __future__ import annotations

import numbers

import numpy as np
from .. import dtypes as _dt
from .._native import lib
from ..autograd import Function
from ..kernels import elementwise as ew
from ..kernels import index as kidx
from ..kernels import reduce as kred
from ..device import CPU
from ..kernels.memory import convert, copy_into
from ..tensor import Tensor, _empty, _wrap_dim
from .math import _zeros


def _no_negative(op: str, index: Tensor, dim: int, size: int) -> None:
    """A negative index is out of bounds here, as in PyTorch (the native kernels would wrap it)."""
    if index.numel() and (low := int(index.detach().min().item())) < 0:
        raise RuntimeError(f"{op}(): index {low} is out of bounds for dimension {dim} with size {size}")


def _check(op: str, x: Tensor, dim: int, index: Tensor, src) -> int:
    if not isinstance(index, Tensor) or index.dtype not in (_dt.int32, _dt.int64):
        got = index.dtype.name if isinstance(index, Tensor) else type(index).__name__
        raise RuntimeError(f"{op}(): Expected dtype int32/int64 for index, got {got}")
    if isinstance(src, Tensor) and src.dtype is not x.dtype:
        raise RuntimeError(f"{op}(): Expected self.dtype to be equal to src.dtype ({x.dtype.name} "
                           f"and {src.dtype.name})")
    d = _wrap_dim(dim, x.ndim)
    if index.ndim != x.ndim or (isinstance(src, Tensor) and src.ndim != x.ndim):
        raise RuntimeError(f"{op}(): Index tensor must have the same number of dimensions as self tensor "
                           f"(and src): index {list(index.shape)}, self {list(x.shape)}")
    if any(n > x.shape[k] for k, n in enumerate(index.shape) if k != d) or \
            (isinstance(src, Tensor) and any(n > m for n, m in zip(index.shape, src.shape))):
        raise RuntimeError(f"{op}(): Expected index {list(index.shape)} to be no larger than self "
                           f"{list(x.shape)} apart from dimension {d}"
                           + (f" and to be no larger size than src {list(src.shape)}" if isinstance(src, Tensor)
                              else ""))
    _no_negative(op, index, d, x.shape[d])
    return d


def _corner(t: Tensor, shape: tuple, keep: int) -> Tensor:
    """The view of t's first shape[k] elements in every dimension k but `keep`."""
    return t._getitem_raw(tuple(slice(None) if k == keep else slice(0, n) for k, n in enumerate(shape)))


def _add_into(out: Tensor, d: int, index: Tensor, src: Tensor) -> Tensor:
    """out (contiguous, fresh) scattered-add with src's corner of index's shape, in place."""
    src = _corner(src, index.shape, -1)
    if all(n == out.shape[k] for k, n in enumerate(index.shape) if k != d):
        return kidx.scatter_add(out, d, index, src)
    region = _corner(out, index.shape, d)
    copy_into(region, kidx.scatter_add(region._clone_raw(), d, index, src))
    return out


def _gather(g: Tensor, d: int, index: Tensor, src_shape: tuple) -> Tensor:
    """src's gradient: g's elements at the index (zeros where src was not used)."""
    picked = kidx.gather(_corner(g, index.shape, d), d, index)
    if tuple(picked.shape) == tuple(src_shape):
        return picked
    out = _zeros(src_shape, g.dtype, g.device)
    copy_into(_corner(out, index.shape, -1), picked)
    return out


def _hits(shape, d: int, index: Tensor, device) -> Tensor:
    """How many index entries point at each position (int64, x's shape)."""
    return _add_into(_zeros(shape, _dt.int64, device), d, index, _ones(index.shape, device))


def _ones(shape, device) -> Tensor:
    out = _empty(shape, _dt.int64, device)
    copy_into(out, 1)
    return out


class Scatter(Function):
    @staticmethod
    def forward(ctx, x, src, d, index):
        ctx.save_for_backward(index)
        ctx.meta = (d, src.shape if isinstance(src, Tensor) else None)
        hits = _hits(x.shape, d, index, x.device)
        hit = kidx.compare(lib.IT_GT, hits, _zeros((), _dt.int64, x.device))
        if not isinstance(src, Tensor):
            value = _empty((), x.dtype, x.device)
            copy_into(value, src)
            return kidx.where(hit, value, x)
        if int(kred.reduce(lib.IT_MAX, hits).item()) > 1:
            return _scatter_on_host(x, d, index, src)
        return kidx.where(hit, _add_into(_zeros(x.shape, x.dtype, x.device), d, index, src), x)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        d, src_shape = ctx.meta
        gx = None
        if ctx.needs_input_grad[0]:
            hit = kidx.compare(lib.IT_GT, _hits(g.shape, d, index, g.device), _zeros((), _dt.int64, g.device))
            gx = kidx.where(hit, _zeros((), g.dtype, g.device), g)
        gsrc = _gather(g, d, index, src_shape) if src_shape is not None and ctx.needs_input_grad[1] else None
        return gx, gsrc, None, None


def _scatter_on_host(x: Tensor, d: int, index: Tensor, src: Tensor) -> Tensor:
    """scatter where some positions are hit twice: numpy's assignment, in which the last wins."""
    out = x._host()._clone_raw()._array()
    idx = index._host()._array().astype(np.int64)
    values = _corner(src, index.shape, -1)._host()._array()
    grid = list(np.indices(idx.shape, sparse=True))
    grid[d] = idx
    out[tuple(grid)] = values
    host = _empty(out.shape, x.dtype, CPU)
    host._array()[...] = out
    return convert(host, x.dtype, x.device)


class ScatterAdd(Function):
    @staticmethod
    def forward(ctx, x, src, d, index):
        ctx.save_for_backward(index)
        ctx.meta = (d, src.shape)
        return _add_into(x._clone_raw(), d, index, src)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        d, src_shape = ctx.meta
        return g, (_gather(g, d, index, src_shape) if ctx.needs_input_grad[1] else None), None, None


class IndexAdd(Function):
    @staticmethod
    def forward(ctx, x, src, d, index, alpha):
        ctx.save_for_backward(index)
        ctx.meta = (d, alpha)
        if alpha != 1:
            src = ew.mul(src, alpha)
        return kidx.index_add(x._clone_raw(), d, index, src)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        d, alpha = ctx.meta
        gsrc = None
        if ctx.needs_input_grad[1]:
            gsrc = kidx.index_select(g, d, index)
            gsrc = ew.mul(gsrc, alpha) if alpha != 1 else gsrc
        return g, gsrc, None, None, None


def source(src, value):
    """scatter's src or value (PyTorch's two overloads: a tensor, or a number as src or value=)."""
    if (src is None) == (value is None):
        raise TypeError("scatter(): give one of src (a tensor) and value (a number)")
    got = src if value is None else value
    if not isinstance(got, (Tensor, numbers.Number)) or (value is not None and isinstance(value, Tensor)):
        raise TypeError(f"scatter(): src must be a tensor and value a number, got {type(got).__name__}")
    return got


def scatter(input: Tensor, dim: int, index: Tensor, src=None, *, value=None, reduce=None) -> Tensor:  # noqa: A002
    """input with src's elements (or value) written at the positions the index names along dim."""
    src = source(src, value)
    if reduce == "add":
        return scatter_add(input, dim, index, src if isinstance(src, Tensor) else _full(index.shape, src, input))
    if reduce is not None:
        raise NotImplementedError(f"scatter(): reduce={reduce!r} is not supported (only 'add'); "
                                  "compute the product out of place")
    d = _check("scatter", input, dim, index, src)
    return Scatter.apply(input, src, d, index)


def _full(shape, value, like: Tensor) -> Tensor:
    out = _empty(shape, like.dtype, like.device)
    copy_into(out, value)
    return out


def scatter_add(input: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:  # noqa: A002
    """input with src's elements added at the positions the index names along dim."""
    if not isinstance(src, Tensor):
        raise TypeError(f"scatter_add(): src must be a tensor, got {type(src).__name__}")
    d = _check("scatter_add", input, dim, index, src)
    return ScatterAdd.apply(input, src, d, index)


def index_add(input: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha=1) -> Tensor:  # noqa: A002
    """input with alpha * source's slices added at the positions a 1-D index names along dim."""
    if not isinstance(index, Tensor) or index.dtype not in (_dt.int32, _dt.int64):
        got = index.dtype.name if isinstance(index, Tensor) else type(index).__name__
        raise RuntimeError(f"index_add_(): Expected dtype int32/int64 for index but got: {got}")
    if not isinstance(source, Tensor) or source.dtype is not input.dtype:
        got = source.dtype.name if isinstance(source, Tensor) else type(source).__name__
        raise RuntimeError(f"index_add_(): self ({input.dtype.name}) and source ({got}) must have the "
                           f"same scalar type")
    if index.ndim > 1:
        raise RuntimeError(f"index_add_(): Index is supposed to be a vector, got shape {list(index.shape)}")
    if input.ndim == 0:
        raise NotImplementedError("index_add_() into a 0-d tensor is not supported; reshape it to (1,)")
    d = _wrap_dim(dim, input.ndim)
    k = index.numel()
    if source.ndim != input.ndim or source.shape[d] != k:
        raise RuntimeError(f"index_add_(): Number of indices ({k}) should be equal to source.size(dim) "
                           f"for dim: {d}; source {list(source.shape)}, self {list(input.shape)}")
    _no_negative("index_add_", index, d, input.shape[d])
    return IndexAdd.apply(input, source, d, index._reshape_raw((k,)), alpha)
