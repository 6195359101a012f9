"""The user-facing Tensor methods: views that autograd records, copies and conversions,
arithmetic and comparison operators, reductions. They are written here, above the ops they
call, and attached to `Tensor` once at import (as torch/_tensor.py does), so that `tensor.py`
stays at the bottom of the package with no import of the layers built on it.

Each module holds one family of methods as the body of a class, whose members are copied onto
`Tensor` below (the classes are never instantiated nor used as bases):

    grad.py         _tracks, backward, retain_grad
    views.py        shape, views and indexing: view, reshape, permute, x[key], x[key] = v, gather,
                    flip, roll, repeat, nonzero, ...
    conversion.py   contiguous, clone, to() and the dtype / device shorthands, pin_memory,
                    DLPack, new_zeros / new_ones / new_tensor; `to_arguments`
    inplace.py      copy_, fill_, zero_, masked_fill_, += -= *= /=, add_ and kin, uniform_, normal_
    arithmetic.py   + - * / // ** @ and their named forms, clamp, where, exp, log, sqrt, ...
    comparison.py   == != < <= > >=, eq and kin, __hash__, & | ~, logical_not
    reductions.py   sum, mean, max, min, var, std, all, any, softmax, cumsum, topk, sort, ...
    serialization.py  __reduce_ex__: pickling (copy, multiprocessing)

No name is defined by two families, so the order of attachment does not matter; it follows
the order the families appeared in when they were one class."""
from __future__ import annotations

from ..tensor import Tensor
from .arithmetic import ArithmeticMethods
from .comparison import ComparisonMethods
from .conversion import ConversionMethods, to_arguments
from .grad import GradMethods
from .inplace import InplaceMethods
from .reductions import ReductionMethods
from .serialization import PickleMethods
from .views import ViewMethods

__all__ = ["to_arguments"]

_FAMILIES = (GradMethods, ViewMethods, ConversionMethods, InplaceMethods, ArithmeticMethods, ComparisonMethods,
             ReductionMethods, PickleMethods)

_CLASS_INTERNALS = {"__dict__", "__weakref__", "__module__", "__doc__", "__qualname__",
                    "__firstlineno__", "__static_attributes__"}
for _family in _FAMILIES:
    for _name, _member in vars(_family).items():
        if _name not in _CLASS_INTERNALS:
            setattr(Tensor, _name, _member)
# numpy defers to Tensor's reflected operators (np.float32(2) * x is a Tensor, not an array)
Tensor.__array_ufunc__ = None
