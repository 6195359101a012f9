"""Fills, copies, casts, concatenation and triangular masks."""
from __future__ import annotations

import math
import numbers
from .. import dtypes as _dt
from .._native import check, ffi, int64_array, lib
from ..tensor import Tensor, _empty, _wrap_dim
from .. import _trace
from . import _checks


@_trace.traced("kernel")
def copy_into(dst: Tensor, src, non_blocking: bool = False) -> None:
    """dst[...] = src, broadcasting src and converting its dtype. non_blocking: a plain copy
    between pinned host memory and a GPU (same dtype and shape, both contiguous) is queued on
    the current stream (it_memcpy_async); any other is made at once."""
    if non_blocking and isinstance(src, Tensor) and _queues(dst, src):
        check(lib.it_memcpy_async(dst.device.native, dst._ptr(), src.device.native, src._ptr(), dst.nbytes,
                                  ffi.NULL))
        return
    if isinstance(src, numbers.Number):
        if dst.is_contiguous():
            check(lib.it_fill(dst.device.native, dst.dtype.native, dst._ptr(), float(src),
                              dst.numel()))
            return
        one = _empty((), dst.dtype, dst.device)
        check(lib.it_fill(one.device.native, one.dtype.native, one._ptr(), float(src), 1))
        src = one
    if not isinstance(src, Tensor):
        raise TypeError(f"cannot copy a {type(src).__name__} into a tensor")
    if _plain_across_devices(dst, src):  # straight into dst: no staging buffer, no second pass over the bytes
        if dst.nbytes:
            check(lib.it_memcpy(dst.device.native, dst._ptr(), src.device.native, src._ptr(), dst.nbytes))
        return
    if src.dtype is not dst.dtype or src.device != dst.device:  # as PyTorch: across devices too
        src = convert(src, dst.dtype, dst.device)
    elif src._storage is dst._storage:
        src = src._clone_raw()  # the copy must not read what it has already overwritten
    try:
        src = src._expand_raw(dst.shape)
    except ValueError:
        raise ValueError(f"copy_: source of shape {tuple(src.shape)} cannot be broadcast to "
                         f"the destination's shape {tuple(dst.shape)}") from None
    check(lib.it_copy_strided(dst.device.native, dst.dtype.native, dst._ptr(),
                              int64_array(dst.stride()), src._ptr(), int64_array(src.stride()),
                              int64_array(dst.shape), dst.ndim))


def _plain_across_devices(dst: Tensor, src: Tensor) -> bool:
    """Whether copying src into dst is one copy of contiguous bytes between two devices."""
    return (src.device != dst.device and src.dtype is dst.dtype and src.shape == dst.shape
            and src.is_contiguous() and dst.is_contiguous())


def _queues(dst: Tensor, src: Tensor) -> bool:
    """Whether copying src into dst can be queued without the host: one side a GPU, the other
    pinned host memory (pageable memory CUDA would stage, so the copy would not overlap), or
    both the same GPU."""
    if src.dtype is not dst.dtype or src.shape != dst.shape or not (src.is_contiguous() and dst.is_contiguous()):
        return False
    kinds = {dst.device.type, src.device.type}
    if kinds == {"cuda"}:
        return dst.device == src.device
    host = dst if dst.device.type == "cpu" else src
    return "cuda" in kinds and host.is_pinned()


@_trace.traced("kernel")
def convert(t: Tensor, dtype: _dt.dtype, device=None) -> Tensor:
    """A contiguous copy of t in dtype (on t's device unless another is named)."""
    device = t.device if device is None else device
    t = t._contiguous_raw()
    if device != t.device:  # across devices: copy as it is, then convert where it arrived
        moved = _empty(t.shape, t.dtype, device)
        check(lib.it_memcpy(device.native, moved._ptr(), t.device.native, t._ptr(), t.nbytes))
        if dtype is t.dtype:
            return moved
        t = moved
    out = _empty(t.shape, dtype, device)
    check(lib.it_cast(device.native, out._ptr(), dtype.native, t._ptr(), t.dtype.native,
                      t.numel()))
    return out


@_trace.traced("kernel")
def cat(tensors, dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat() needs at least one tensor")
    first = tensors[0]
    d = _wrap_dim(dim, first.ndim)
    for i, t in enumerate(tensors[1:], 1):
        _checks.same_device("cat", **{"tensors[0]": first, f"tensors[{i}]": t})
        _checks.same_dtype("cat", **{"tensors[0]": first, f"tensors[{i}]": t})
        if t.ndim != first.ndim or t.shape[:d] + t.shape[d + 1:] != first.shape[:d] + first.shape[d + 1:]:
            raise ValueError(f"cat(): tensors[{i}] has shape {tuple(t.shape)}, which does not "
                             f"match tensors[0]'s {tuple(first.shape)} outside dimension {d}")
    parts = [t._contiguous_raw() for t in tensors]
    sizes = [t.shape[d] for t in parts]
    shape = first.shape[:d] + (sum(sizes),) + first.shape[d + 1:]
    out = _empty(shape, first.dtype, first.device)
    ptrs = ffi.new("void *[]", [t._ptr() for t in parts])
    check(lib.it_concat(out.device.native, out.dtype.native, out._ptr(), ptrs, int64_array(sizes),
                        len(parts), math.prod(shape[:d]), math.prod(shape[d + 1:])))
    return out


@_trace.traced("kernel")
def split_copy(t: Tensor, sizes, dim: int = 0) -> list:
    """Splits along dim into new contiguous tensors (Tensor.split gives views instead)."""
    d = _wrap_dim(dim, t.ndim)
    if sum(sizes) != t.shape[d]:
        raise ValueError(f"split: sizes {list(sizes)} do not add up to {t.shape[d]}")
    t = t._contiguous_raw()
    outs = [_empty(t.shape[:d] + (s,) + t.shape[d + 1:], t.dtype, t.device) for s in sizes]
    ptrs = ffi.new("void *[]", [o._ptr() for o in outs])
    check(lib.it_split(t.device.native, t.dtype.native, ptrs, t._ptr(), int64_array(sizes),
                       len(outs), math.prod(t.shape[:d]), math.prod(t.shape[d + 1:])))
    return outs


def stack(tensors, dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack() needs at least one tensor")
    d = _wrap_dim(dim, tensors[0].ndim + 1)
    return cat([t._unsqueeze_raw(d) for t in tensors], d)


@_trace.traced("kernel")
def triangle(t: Tensor, diagonal: int, upper: bool, fill_value: float = 0.0) -> Tensor:
    if t.ndim < 2:
        raise ValueError(f"{'triu' if upper else 'tril'}() needs at least 2 dimensions, got "
                         f"shape {tuple(t.shape)}")
    t = t._contiguous_raw()
    out = _empty(t.shape, t.dtype, t.device)
    rows, cols = t.shape[-2:]
    check(lib.it_triangle(t.device.native, t.dtype.native, out._ptr(), t._ptr(),
                          math.prod(t.shape[:-2]), rows, cols, diagonal, int(upper),
                          float(fill_value)))
    return out
