"""Comparisons, selection, indexing along one axis, running sums, top-k and sampling."""
from __future__ import annotations

import math
from .. import dtypes as _dt
from .._native import check, ffi, int64_array, lib
from ..tensor import Tensor, _empty, _wrap_dim
from .. import _trace
from . import _checks
from .elementwise import _broadcast_strides, broadcast_shapes


@_trace.traced("kernel")
def compare(op: int, a: Tensor, b: Tensor) -> Tensor:
    """a op b elementwise with broadcasting -> bool; a and b must share dtype and device."""
    _checks.same_device("comparison", left=a, right=b)
    _checks.same_dtype("comparison", left=a, right=b)
    shape = broadcast_shapes(a.shape, b.shape)
    out = _empty(shape, _dt.bool, a.device)
    check(lib.it_compare(a.device.native, op, a.dtype.native,
                         ffi.cast("uint8_t *", out.data_ptr()), a._ptr(),
                         int64_array(_broadcast_strides(a, shape)), b._ptr(),
                         int64_array(_broadcast_strides(b, shape)), int64_array(shape), len(shape)))
    return out


@_trace.traced("kernel")
def where(cond: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """cond ? a : b with broadcasting; cond is bool, a and b share a dtype."""
    if cond.dtype is not _dt.bool:
        raise TypeError(f"where: the condition must be a bool tensor, got {cond.dtype.name}")
    _checks.same_device("where", condition=cond, input=a, other=b)
    _checks.same_dtype("where", input=a, other=b)
    shape = broadcast_shapes(cond.shape, a.shape, b.shape)
    out = _empty(shape, a.dtype, a.device)
    check(lib.it_where(a.device.native, a.dtype.native, out._ptr(),
                       ffi.cast("uint8_t *", cond.data_ptr()),
                       int64_array(_broadcast_strides(cond, shape)), a._ptr(),
                       int64_array(_broadcast_strides(a, shape)), b._ptr(),
                       int64_array(_broadcast_strides(b, shape)), int64_array(shape), len(shape)))
    return out


def _axis(x_shape: tuple, d: int) -> tuple:
    return math.prod(x_shape[:d]), x_shape[d] if x_shape else 1, math.prod(x_shape[d + 1:])


@_trace.traced("kernel")
def gather(x: Tensor, dim: int, index: Tensor) -> Tensor:
    """out[..., j, ...] = x[..., index[..., j, ...], ...] along dim (torch.gather), for an
    index of x's shape except along dim."""
    _checks.index_tensor("gather", "index", index)
    _checks.same_device("gather", input=x, index=index)
    d = _wrap_dim(dim, x.ndim)
    if index.ndim != x.ndim or any(index.shape[i] != x.shape[i] for i in range(x.ndim) if i != d):
        raise ValueError(f"gather: index of shape {tuple(index.shape)} must match the input's "
                         f"{tuple(x.shape)} in every dimension but {d}")
    x, index = x._contiguous_raw(), index._contiguous_raw()
    outer, n, inner = _axis(x.shape, d)
    k = index.shape[d] if index.ndim else 1
    out = _empty(index.shape, x.dtype, x.device)
    check(lib.it_gather(x.device.native, x.dtype.native, out._ptr(), x._ptr(), index._ptr(),
                        index.dtype.native, outer, n, k, inner))
    return out


@_trace.traced("kernel")
def scatter_add(out: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """out[..., index[..., j, ...], ...] += src[..., j, ...] along dim, in place; returns out."""
    _checks.index_tensor("scatter_add", "index", index)
    _checks.same_dtype("scatter_add", out=out, src=src)
    _checks.shape_is("scatter_add", "src", src, index.shape)
    if not out.is_contiguous():
        raise ValueError("scatter_add: out must be contiguous")
    d = _wrap_dim(dim, out.ndim)
    outer, n, inner = _axis(out.shape, d)
    index, src = index._contiguous_raw(), src._contiguous_raw()
    k = index.shape[d] if index.ndim else 1
    check(lib.it_scatter_add(out.device.native, out.dtype.native, out._ptr(), src._ptr(),
                             index._ptr(), index.dtype.native, outer, n, k, inner))
    return out


@_trace.traced("kernel")
def index_select(x: Tensor, dim: int, index: Tensor) -> Tensor:
    """The slices of x along dim named by a 1-D index (torch.index_select)."""
    _checks.index_tensor("index_select", "index", index)
    _checks.same_device("index_select", input=x, index=index)
    if index.ndim > 1:
        raise ValueError(f"index_select: index must be 1-D, got shape {tuple(index.shape)}")
    if x.ndim == 0:
        raise IndexError("index_select: cannot index a 0-d tensor along a dimension")
    d = _wrap_dim(dim, x.ndim)
    x, index = x._contiguous_raw(), index._contiguous_raw()
    outer, n, inner = _axis(x.shape, d)
    k = index.numel()
    out = _empty(x.shape[:d] + (k,) + x.shape[d + 1:], x.dtype, x.device)
    check(lib.it_index_select(x.device.native, x.dtype.native, out._ptr(), x._ptr(),
                              index._ptr(), index.dtype.native, outer, n, k, inner))
    return out


@_trace.traced("kernel")
def index_add(out: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """out.index_select(dim, index) += src, in place (repeated indices add up); returns out."""
    _checks.index_tensor("index_add", "index", index)
    _checks.same_dtype("index_add", out=out, src=src)
    if not out.is_contiguous():
        raise ValueError("index_add: out must be contiguous")
    d = _wrap_dim(dim, out.ndim)
    outer, n, inner = _axis(out.shape, d)
    k = index.numel()
    _checks.shape_is("index_add", "src", src, out.shape[:d] + (k,) + out.shape[d + 1:])
    index, src = index._contiguous_raw(), src._contiguous_raw()
    check(lib.it_index_add(out.device.native, out.dtype.native, out._ptr(), src._ptr(),
                           index._ptr(), index.dtype.native, outer, n, k, inner))
    return out


@_trace.traced("kernel")
def cumsum(x: Tensor, dim: int) -> Tensor:
    """Running sum along dim; integer and bool inputs give int64, as in PyTorch."""
    from .memory import convert
    if not x.dtype.is_floating_point and x.dtype is not _dt.int64:
        x = convert(x, _dt.int64)
    d = _wrap_dim(dim, x.ndim)
    x = x._contiguous_raw()
    out = _empty(x.shape, x.dtype, x.device)
    outer, n, inner = _axis(x.shape, d)
    check(lib.it_cumsum(x.device.native, x.dtype.native, out._ptr(), x._ptr(), outer, n, inner))
    return out


@_trace.traced("kernel")
def topk(x: Tensor, k: int, dim: int = -1, largest: bool = True) -> tuple:
    """(values, int64 indices) of the k largest (smallest) entries along dim, sorted."""
    d = _wrap_dim(dim, x.ndim)
    n = x.shape[d] if x.ndim else 1
    if not 0 <= k <= n:
        raise ValueError(f"topk: k = {k} is out of range for a dimension of size {n}")
    last = list(range(x.ndim))
    if x.ndim:
        last[d], last[-1] = last[-1], last[d]
    moved = x._permute_raw(last)._contiguous_raw()
    rows = moved.numel() // n if n else math.prod(moved.shape[:-1])
    shape = moved.shape[:-1] + (k,)
    values, indices = _empty(shape, x.dtype, x.device), _empty(shape, _dt.int64, x.device)
    check(lib.it_topk(x.device.native, x.dtype.native, values._ptr(),
                      ffi.cast("int64_t *", indices.data_ptr()), moved._ptr(), rows, n, k,
                      int(largest)))
    if x.ndim == 0:
        return values._reshape_raw(()), indices._reshape_raw(())
    return (values._permute_raw(last)._contiguous_raw(),
            indices._permute_raw(last)._contiguous_raw())


@_trace.traced("kernel")
def multinomial(weights: Tensor, num_samples: int, replacement: bool, generator) -> Tensor:
    """Category indices drawn from each row of non-negative weights [n] or [rows, n]."""
    _checks.floating("multinomial", "weights", weights)
    if weights.ndim not in (1, 2):
        raise ValueError(f"multinomial: weights must be 1-D or 2-D, got shape {tuple(weights.shape)}")
    w = weights._contiguous_raw()
    rows, n = (1, w.shape[0]) if w.ndim == 1 else w.shape
    out = _empty(w.shape[:-1] + (num_samples,), _dt.int64, w.device)
    offset = generator._take(rows * num_samples)
    check(lib.it_multinomial(w.device.native, w.dtype.native,
                             ffi.cast("int64_t *", out.data_ptr()), w._ptr(), rows, n,
                             num_samples, int(replacement), generator.seed, offset))
    return out
