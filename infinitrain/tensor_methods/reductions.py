"""Tensor methods that reduce, or work along a dimension: sum, mean, max, min, amax, amin, argmax,
argmin, var, std, logsumexp, all, any, softmax, log_softmax, cumsum, topk, sort, argsort, kthvalue,
median, norm. Those giving values and indices return PyTorch's named tuples (return_types)."""
from __future__ import annotations

import builtins
import math
from ..ops import index as _idx
from ..ops import math as _ops
from ..ops import norms as _norms
from ..ops import reductions as _reductions
from ..ops.shape import cat as _cat
from .. import return_types
from ..tensor import Tensor, _wrap_dim


class ReductionMethods:
    def sum(self, dim=None, keepdim: builtins.bool = False, *, dtype=None):
        return _reductions.sum(self if dtype is None else self.to(dtype=dtype), dim, keepdim)

    def mean(self, dim=None, keepdim: builtins.bool = False):
        return _reductions.mean(self, dim, keepdim)

    def max(self, dim=None, keepdim: builtins.bool = False):
        """The largest value; along an int dim, (values, indices); with a tensor, maximum()."""
        if isinstance(dim, Tensor):
            return _ops.maximum(self, dim, True)
        out = _reductions.extreme(self, dim, keepdim, True)
        return return_types.max(*out) if isinstance(out, tuple) else out

    def min(self, dim=None, keepdim: builtins.bool = False):
        if isinstance(dim, Tensor):
            return _ops.maximum(self, dim, False)
        out = _reductions.extreme(self, dim, keepdim, False)
        return return_types.min(*out) if isinstance(out, tuple) else out

    def amax(self, dim=(), keepdim: builtins.bool = False):
        return _reductions.amax(self, dim, keepdim, True)

    def amin(self, dim=(), keepdim: builtins.bool = False):
        return _reductions.amax(self, dim, keepdim, False)

    def argmax(self, dim=None, keepdim: builtins.bool = False):
        from ..kernels.reduce import arg_extreme
        return arg_extreme(self, dim, keepdim, True)

    def argmin(self, dim=None, keepdim: builtins.bool = False):
        from ..kernels.reduce import arg_extreme
        return arg_extreme(self, dim, keepdim, False)

    def var(self, dim=None, keepdim: builtins.bool = False, *, correction: int = 1,
            unbiased: builtins.bool | None = None):
        if unbiased is not None:
            correction = 1 if unbiased else 0
        x = self if self.dtype.is_floating_point else self.float()
        n = math.prod(x.shape[d] for d in range(x.ndim)) if dim is None else \
            math.prod(x.shape[_wrap_dim(d, x.ndim)] for d in (dim if isinstance(dim, (tuple, list)) else (dim,)))
        centered = x - x.mean(dim, keepdim=True)
        return (centered * centered).sum(dim, keepdim) / builtins.max(n - correction, 0)

    def std(self, dim=None, keepdim: builtins.bool = False, *, correction: int = 1,
            unbiased: builtins.bool | None = None):
        return self.var(dim, keepdim, correction=correction, unbiased=unbiased).sqrt()

    def logsumexp(self, dim, keepdim: builtins.bool = False):
        return _idx.logsumexp(self, dim, keepdim)

    def all(self, dim=None, keepdim: builtins.bool = False):
        return self.bool().logical_not().float().sum(dim, keepdim) == 0

    def any(self, dim=None, keepdim: builtins.bool = False):
        return self.bool().float().sum(dim, keepdim) > 0

    def softmax(self, dim: int = -1, dtype=None):
        return _ops.softmax(self if dtype is None else self.to(dtype=dtype), dim)

    def log_softmax(self, dim: int = -1):
        return _idx.log_softmax(self, dim)

    def cumsum(self, dim: int):
        return _idx.cumsum(self, dim)

    def topk(self, k: int, dim: int = -1, largest: builtins.bool = True, sorted: builtins.bool = True):  # noqa: A002
        return return_types.topk(*_idx.topk(self, k, dim, largest, sorted))

    def sort(self, dim: int = -1, descending: builtins.bool = False, stable: builtins.bool = False):
        """(values, indices) along dim, differentiable in the values (topk of the whole dim)."""
        return return_types.sort(*_idx.topk(self, self.shape[dim] if self.ndim else 1, dim, descending, True))

    def kthvalue(self, k: int, dim: int = -1, keepdim: builtins.bool = False):
        """(values, indices) of the k-th smallest element along dim (k counts from 1)."""
        n = self.shape[dim] if self.ndim else 1
        if not 1 <= k <= n:
            raise IndexError(f"kthvalue(): k = {k} is out of range for a dimension of size {n}")
        values, indices = _idx.topk(self, k, dim, False, True)
        return return_types.kthvalue(*(t.narrow(dim, k - 1, 1) if keepdim else t.select(dim, k - 1)
                                       for t in (values, indices)))

    def median(self, dim=None, keepdim: builtins.bool = False):
        """The lower of the two middle values (PyTorch's median); along a dim, (values, indices)."""
        if dim is None:
            flat = self.reshape(-1)
            return flat.kthvalue((flat.shape[0] + 1) // 2).values
        n = self.shape[dim] if self.ndim else 1
        return return_types.median(*self.kthvalue((n + 1) // 2, dim, keepdim))

    def norm(self, p="fro", dim=None, keepdim: builtins.bool = False, dtype=None):
        """torch.norm: a vector norm of order p (2 for 'fro') over dim (None: all of it)."""
        if p == "fro":
            p = 2
        if isinstance(p, str):
            raise NotImplementedError(f"norm(p={p!r}) is not implemented (numbers, inf and 'fro' are)")
        return _norms.vector_norm(self, p, dim, keepdim, dtype=dtype)

    def argsort(self, dim: int = -1, descending: builtins.bool = False):
        return self.sort(dim, descending)[1]

    def prod(self, dim=None, keepdim: builtins.bool = False, *, dtype=None):
        """The product over dim (None: everything), by pairwise products (exact gradients where
        elements are zero); bool and integer tensors give int64."""
        x = self if dtype is None else self.to(dtype=dtype)
        if not x.dtype.is_floating_point:
            x = x.long()
        if dim is None:
            out = _product_along(x.reshape(-1), 0).reshape(())
            return out.reshape((1,) * x.ndim) if keepdim else out
        d = _wrap_dim(dim, x.ndim)
        out = _product_along(x, d)
        return out if keepdim else out.squeeze(d)


def _product_along(x, d: int):
    """x's product along d, kept as a dim of size 1: the two halves multiplied until one is left."""
    while x.shape[d] > 1:
        n = x.shape[d]
        half = n // 2
        paired = x.narrow(d, 0, half) * x.narrow(d, half, half)
        x = paired if n % 2 == 0 else _cat([paired, x.narrow(d, n - 1, 1)], d)
    if x.shape[d] == 0:
        from ..creation import ones
        return ones(tuple(1 if i == d else n for i, n in enumerate(x.shape)), dtype=x.dtype, device=x.device)
    return x
