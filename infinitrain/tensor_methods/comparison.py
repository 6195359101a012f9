"""Tensor methods of comparison and logic: == != < <= > >= and their named forms (eq, ne, lt, le,
gt, ge), __hash__ (by identity, since == gives a tensor), & | ~ on bool tensors, logical_not."""
from __future__ import annotations

from .. import dtypes as _dt
from .._native import lib
from ..ops import index as _idx
from ..tensor import Tensor


class ComparisonMethods:
    # comparisons give bool tensors (so tensors hash by identity, as in PyTorch)
    def __eq__(self, other):
        return _idx.compare(lib.IT_EQ, self, other)

    def __ne__(self, other):
        return _idx.compare(lib.IT_NE, self, other)

    def __lt__(self, other):
        return _idx.compare(lib.IT_LT, self, other)

    def __le__(self, other):
        return _idx.compare(lib.IT_LE, self, other)

    def __gt__(self, other):
        return _idx.compare(lib.IT_GT, self, other)

    def __ge__(self, other):
        return _idx.compare(lib.IT_GE, self, other)

    __hash__ = object.__hash__

    def eq(self, other):
        return self == other

    def ne(self, other):
        return self != other

    def lt(self, other):
        return self < other

    def le(self, other):
        return self <= other

    def gt(self, other):
        return self > other

    def ge(self, other):
        return self >= other

    greater, greater_equal, less, less_equal, not_equal = gt, ge, lt, le, ne

    def __and__(self, other):
        return _logical(self, other, lib.IT_MINIMUM)

    def __or__(self, other):
        return _logical(self, other, lib.IT_MAXIMUM)

    def __invert__(self):
        if self.dtype is not _dt.bool:
            raise TypeError(f"~ is defined for bool tensors here, not {self.dtype.name}")
        return self == False  # noqa: E712

    def logical_not(self):
        return self.bool() == False  # noqa: E712


def _logical(a: Tensor, b, op: int) -> Tensor:
    """and / or of bool tensors (min / max of 0-1 values)."""
    from ..kernels.elementwise import binary
    if not isinstance(b, Tensor) or a.dtype is not _dt.bool or b.dtype is not _dt.bool:
        raise TypeError("& and | are defined for two bool tensors here")
    return binary(op, a, b)
