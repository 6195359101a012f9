"""Matrix products: linear layers (x Wᵀ + b) and batched matmul with broadcasting."""
from __future__ import annotations

import math

from .._native import check, lib
from ..tensor import Tensor, _empty
from .. import _trace
from . import _checks
from .elementwise import broadcast_shapes
from .memory import copy_into



# ---- matrix products -----------------------------------------------------------------
@_trace.traced("kernel")
def linear(x2d: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x2d [N, in] @ weight[out, in]^T + bias: one sgemm, the bias preloaded into the output
    and accumulated into by the product (beta = 1) instead of a separate pass."""
    _checks.same_device("linear", input=x2d, weight=weight, bias=bias)
    _checks.same_dtype("linear", input=x2d, weight=weight, bias=bias)
    _checks.floating("linear", "input", x2d)
    n, k = x2d.shape
    o = weight.shape[0]
    if weight.shape != (o, k):
        raise ValueError(f"linear: input has {k} features but weight has shape {tuple(weight.shape)} "
                         f"(expected [out_features, {k}])")
    if bias is not None and bias.shape != (o,):
        raise ValueError(f"linear: bias has shape {tuple(bias.shape)}, expected ({o},)")
    x2d, weight = x2d._contiguous_raw(), weight._contiguous_raw()
    out = _empty((n, o), x2d.dtype, x2d.device)
    if bias is not None:
        copy_into(out, bias._expand_raw((n, o)))
    check(lib.it_matmul(x2d.device.native, x2d.dtype.native, out._ptr(), x2d._ptr(), weight._ptr(),
                        1, n, o, k, 0, 1, 1.0, 1.0 if bias is not None else 0.0, 0, 0, 0))
    return out



def _as_matrices(x: Tensor, batch: tuple):
    """x expanded to batch + its last two dims, as (tensor, transposed, batch_stride) such that
    problem i starts at tensor's data + i * batch_stride, copying only when the layout needs it."""
    x = x._expand_raw(batch + x.shape[-2:])
    rows, cols = x.shape[-2:]
    s_row, s_col = x.stride()[-2:]
    if (s_col == 1 or cols == 1) and (s_row == cols or rows == 1):
        trans = False
    elif (s_row == 1 or rows == 1) and (s_col == rows or cols == 1):
        trans = True
    else:
        x, trans = x._contiguous_raw(), False
    bshape, bstrides = x.shape[:-2], x.stride()[:-2]
    live = [(n, s) for n, s in zip(bshape, bstrides) if n != 1]
    if not live or all(s == 0 for _, s in live):
        return x, trans, 0
    uniform = all(live[i][1] == live[i + 1][1] * live[i + 1][0] for i in range(len(live) - 1))
    if uniform and all(s != 0 for _, s in live):
        return x, trans, live[-1][1]
    x = x._contiguous_raw()
    return x, False, rows * cols


@_trace.traced("kernel")
def matmul(a: Tensor, b: Tensor) -> Tensor:
    if not isinstance(b, Tensor):
        raise TypeError(f"matmul: expected a tensor, got {type(b).__name__}")
    _checks.same_device("matmul", left=a, right=b)
    _checks.same_dtype("matmul", left=a, right=b)
    _checks.floating("matmul", "left", a)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul: both operands need at least one dimension")
    squeeze_rows, squeeze_cols = a.ndim == 1, b.ndim == 1
    a2 = a._unsqueeze_raw(0) if squeeze_rows else a
    b2 = b._unsqueeze_raw(-1) if squeeze_cols else b
    m, k = a2.shape[-2:]
    k2, n = b2.shape[-2:]
    if k != k2:
        raise ValueError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not line up "
                         f"({k} != {k2})")
    batch = broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    if b2.ndim == 2 and a2.ndim > 2 and a2.is_contiguous():
        # One large product instead of a loop over the batch: fold it into the rows of a.
        out = matmul(a2._reshape_raw((a2.numel() // k if k else math.prod(a2.shape[:-1]), k)),
                     b2)._reshape_raw(batch + (m, n))
    else:
        am, ta, sa = _as_matrices(a2, batch)
        bm, tb, sb = _as_matrices(b2, batch)
        out = _empty(batch + (m, n), a.dtype, a.device)
        check(lib.it_matmul(a.device.native, a.dtype.native, out._ptr(), am._ptr(), bm._ptr(),
                            math.prod(batch), m, n, k, int(ta), int(tb), 1.0, 0.0, sa, sb, m * n))
    if squeeze_rows:
        out = out._squeeze_raw(-2)
    if squeeze_cols:
        out = out._squeeze_raw(-1)
    return out
