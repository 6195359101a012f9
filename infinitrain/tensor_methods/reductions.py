"""Tensor methods that reduce, or work along a dimension: sum, mean, max, min, amax, amin, argmax,
argmin, var, std, logsumexp, all, any, softmax, log_softmax, cumsum, topk, sort, argsort."""
from __future__ import annotations

import builtins
import math
from ..ops import index as _idx
from ..ops import math as _ops
from ..ops import reductions as _reductions
from ..tensor import _wrap_dim


class ReductionMethods:
    def sum(self, dim=None, keepdim: builtins.bool = False, *, dtype=None):
        return _reductions.sum(self if dtype is None else self.to(dtype=dtype), dim, keepdim)

    def mean(self, dim=None, keepdim: builtins.bool = False):
        return _reductions.mean(self, dim, keepdim)

    def max(self, dim=None, keepdim: builtins.bool = False):
        return _reductions.extreme(self, dim, keepdim, True)

    def min(self, dim=None, keepdim: builtins.bool = False):
        return _reductions.extreme(self, dim, keepdim, False)

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

    def all(self):
        return self.bool().logical_not().float().sum() == 0

    def any(self):
        return self.bool().float().sum() > 0

    def softmax(self, dim: int = -1, dtype=None):
        return _ops.softmax(self if dtype is None else self.to(dtype=dtype), dim)

    def log_softmax(self, dim: int = -1):
        return _idx.log_softmax(self, dim)

    def cumsum(self, dim: int):
        return _idx.cumsum(self, dim)

    def topk(self, k: int, dim: int = -1, largest: builtins.bool = True, sorted: builtins.bool = True):  # noqa: A002
        return _idx.topk(self, k, dim, largest, sorted)

    def sort(self, dim: int = -1, descending: builtins.bool = False):
        """(values, indices) along dim, differentiable in the values (topk of the whole dim)."""
        return _idx.topk(self, self.shape[dim] if self.ndim else 1, dim, descending, True)

    def argsort(self, dim: int = -1, descending: builtins.bool = False):
        return self.sort(dim, descending)[1]
