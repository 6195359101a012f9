"""Differentiable selection and indexing: where, masked_fill, gather, index_select, cumsum,
topk, and the log-space reductions (logsumexp, log_softmax) built on them."""
from __future__ import annotations

from .. import dtypes as _dt
from .._native import lib
from ..autograd import Function
from ..kernels import elementwise as ew
from ..kernels import reduce as kred
from ..kernels import index as kidx
from ..kernels.memory import copy_into
from ..tensor import Tensor, _empty, _wrap_dim
from . import math as _math
from .math import _zeros, cast, promote, sum_to


class Where(Function):
    @staticmethod
    def forward(ctx, cond, a, b):
        ctx.save_for_backward(cond)
        ctx.shapes = (a.shape, b.shape)
        return kidx.where(cond, a, b)

    @staticmethod
    def backward(ctx, g):
        (cond,) = ctx.saved_tensors
        zero = _zeros((), g.dtype, g.device)
        ga = sum_to(kidx.where(cond, g, zero), ctx.shapes[0]) if ctx.needs_input_grad[1] else None
        gb = sum_to(kidx.where(cond, zero, g), ctx.shapes[1]) if ctx.needs_input_grad[2] else None
        return None, ga, gb


def _as_tensor(value, like: Tensor) -> Tensor:
    out = _empty((), like.dtype, like.device)
    copy_into(out, value)
    return out


def where(cond: Tensor, a, b) -> Tensor:
    """cond ? a : b elementwise (torch.where); a or b may be numbers."""
    if not isinstance(cond, Tensor) or cond.dtype is not _dt.bool:
        raise TypeError("where: the condition must be a bool tensor (e.g. x > 0)")
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise TypeError("where: at least one of the two values must be a tensor")
    if not isinstance(a, Tensor):
        b, a = promote(b, a)
        a = _as_tensor(a, b)
    elif not isinstance(b, Tensor):
        a, b = promote(a, b)
        b = _as_tensor(b, a)
    else:
        a, b = promote(a, b)
    return Where.apply(cond, a, b)


def masked_fill(x: Tensor, mask: Tensor, value) -> Tensor:
    """x with value where mask is true (mask broadcasts to x's shape)."""
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise ValueError(f"masked_fill: value must be a number or a 0-d tensor, got shape "
                             f"{tuple(value.shape)}")
        value = cast(value, x.dtype)
    else:
        value = _as_tensor(value, x)
    if ew.broadcast_shapes(mask.shape, x.shape) != tuple(x.shape):
        raise ValueError(f"masked_fill: mask of shape {tuple(mask.shape)} does not broadcast to "
                         f"the input's {tuple(x.shape)}")
    return Where.apply(mask, value, x)


def compare(op: int, a: Tensor, b) -> Tensor:
    """a op b -> bool tensor, with type promotion; never recorded (no gradient)."""
    a, b = promote(a, b)
    if not isinstance(b, Tensor):
        b = _as_tensor(b, a)
    return kidx.compare(op, a.detach(), b.detach())


class Gather(Function):
    @staticmethod
    def forward(ctx, x, dim, index):
        ctx.save_for_backward(index)
        ctx.meta = (x.shape, x.dtype, x.device, dim)
        return kidx.gather(x, dim, index)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        shape, dtype, device, dim = ctx.meta
        return kidx.scatter_add(_zeros(shape, dtype, device), dim, index, g), None, None


def gather(x: Tensor, dim: int, index: Tensor) -> Tensor:
    return Gather.apply(x, dim, index)


class IndexSelect(Function):
    @staticmethod
    def forward(ctx, x, dim, index):
        ctx.save_for_backward(index)
        ctx.meta = (x.shape, x.dtype, x.device, dim)
        return kidx.index_select(x, dim, index)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        shape, dtype, device, dim = ctx.meta
        return kidx.index_add(_zeros(shape, dtype, device), dim, index, g), None, None


def index_select(x: Tensor, dim: int, index: Tensor) -> Tensor:
    return IndexSelect.apply(x, dim, index)


class Cumsum(Function):
    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim = dim
        return kidx.cumsum(x, dim)

    @staticmethod
    def backward(ctx, g):
        # d/dx_j of sum_{i >= j}: the reversed running sum of the gradient
        d = _wrap_dim(ctx.dim, g.ndim)
        n = g.shape[d] if g.ndim else 1
        total = kred.reduce(lib.IT_SUM, g, d, keepdim=True) if g.ndim else g
        before = ew.sub(kidx.cumsum(g, d), g)
        return ew.sub(total._expand_raw(g.shape) if n else g, before), None


def cumsum(x: Tensor, dim: int) -> Tensor:
    if x.dtype.is_floating_point:
        return Cumsum.apply(x, dim)
    return kidx.cumsum(x, dim)


def topk(x: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):  # noqa: A002
    """(values, indices); values carry the gradient back to the chosen entries."""
    _, indices = kidx.topk(x.detach(), k, dim, largest)
    return gather(x, dim, indices), indices


def logsumexp(x: Tensor, dim, keepdim: bool = False) -> Tensor:
    """log(sum(exp(x))) over dim, shifted by the maximum so that it cannot overflow."""
    from . import math as m
    from . import reductions as r
    if not x.dtype.is_floating_point:
        x = cast(x, _dt.float32)
    shift = r.amax(x.detach(), dim, keepdim=True)
    # an all -inf (or inf) slice would give inf - inf: shift those by 0 instead
    finite = kidx.compare(lib.IT_EQ, ew.unary(lib.IT_ABS, shift), _as_tensor(float("inf"), shift))
    shift = kidx.where(finite, _zeros((), shift.dtype, shift.device), shift)
    out = m.unary(lib.IT_LOG, r.sum(m.unary(lib.IT_EXP, m.sub(x, shift)), dim, keepdim=True))
    out = m.add(out, shift)
    if not keepdim:
        from .shape import Reshape
        dims = kred.reduce_dims(x, dim)
        out = Reshape.apply(out, tuple(n for i, n in enumerate(x.shape) if i not in dims))
    return out


def log_softmax(x: Tensor, dim: int) -> Tensor:
    from . import math as m
    return m.sub(x, logsumexp(x, dim, keepdim=True))


def floor_divide(a, b):
    """a // b rounded toward negative infinity, as Python's // and torch.floor_divide; in a's
    (promoted) dtype, with no gradient (the result is piecewise constant). Integer division by
    zero is an error, as in Python."""
    a, b = _math._arith(a.detach() if isinstance(a, Tensor) else a, b.detach() if isinstance(b, Tensor) else b)
    if not a.dtype.is_floating_point:
        zero = compare(lib.IT_EQ, b, 0) if isinstance(b, Tensor) else None
        if (b == 0) if zero is None else bool(zero.any().item()):
            raise ZeroDivisionError("floor_divide: integer division by zero")
        # exactly, in integers (through float64 it rounded past 2^53: (2**53 + 1) // 1 gave 2**53);
        # no kernel divides integers, so numpy does, on the host
        import numpy as np
        from ..device import as_device
        host = np.floor_divide(a.cpu().numpy(), b.cpu().numpy() if isinstance(b, Tensor) else b)
        staged = _empty(host.shape, a.dtype, as_device("cpu"))  # (CPU tensors share numpy's memory)
        np.copyto(staged.numpy(), host, casting="unsafe")
        if a.device.type == "cpu":
            return staged
        out = _empty(host.shape, a.dtype, a.device)
        copy_into(out, staged)
        return out
    q = _math.div(a, b)
    whole = _math.cast(_math.cast(q, _dt.int64), q.dtype)  # rounded toward zero
    floor = where(compare(lib.IT_GT, whole, q), whole - 1, whole)
    # |q| >= 2^52 is a whole number already (and inf, nan stay as they are)
    return where(compare(lib.IT_LT, q.abs(), 2.0 ** 52), floor, q)


def rfloor_divide(a, s):
    a, s = _math._arith(a, s)
    return floor_divide(_as_tensor(s, a), a)
