"""The user-facing Tensor methods: views that autograd records, copies and conversions,
arithmetic and comparison operators, reductions. They are written here, above the ops they
call, and attached to `Tensor` once at import (as torch/_tensor.py does), so that `tensor.py`
stays at the bottom of the package with no import of the layers built on it."""
from __future__ import annotations

import builtins
import math
from . import dtypes as _dt
from ._native import lib
from .autograd.grad_mode import is_grad_enabled
from .device import as_device
from .device import device as Device
from . import dlpack as _dlpack
from .kernels import memory
from .ops import index as _idx
from .ops import math as _ops
from .ops import shape as _shape
from .tensor import Tensor, _empty, _wrap_dim


def _advanced_index(x, key):
    """(the tensor x[key] with the one index tensor, list or bool mask of key replaced by full
    slices, the dimension where that index applies, the index as a tensor), or None when key
    has none. Two index tensors at once (x[i, j]) are refused."""
    import numpy as np
    from .creation import tensor
    parts = key if isinstance(key, tuple) else (key,)
    advanced = [i for i, k in enumerate(parts) if isinstance(k, (Tensor, list, np.ndarray))]
    if not advanced:
        return None
    if len(advanced) > 1:
        raise NotImplementedError("indexing with more than one index tensor at once (x[i, j]) is not supported; "
                                  "index one dimension at a time")
    at = advanced[0]
    index = parts[at]
    if not isinstance(index, Tensor):
        arr = np.asarray(index)
        index = tensor(arr, dtype=_dt.bool if arr.dtype == np.bool_ else _dt.int64, device=x.device)
    if index.dtype is not _dt.bool and index.dtype.is_floating_point:
        raise IndexError(f"tensors used as indices must be integer or bool, not {index.dtype}")
    width = index.ndim if index.dtype is _dt.bool else 1
    basic = parts[:at] + (slice(None),) * width + parts[at + 1:]
    y = x[basic] if len(basic) > 1 or width > 1 else x[basic[0]]
    # the output dimension where the index's dimensions sit: those before it that survive
    used = builtins.sum(1 for k in basic if k is not None and k is not Ellipsis)
    dim = 0
    for k in parts[:at]:
        if k is Ellipsis:
            dim += x.ndim - used
        elif k is None or isinstance(k, slice):
            dim += 1
    return y, dim, index


def _positions(values, device) -> Tensor:
    """A 1-D int64 index tensor of these positions on device."""
    from .creation import tensor
    return tensor(list(values), dtype=_dt.int64, device=device)


class TensorMethods:
    # ---- views ---------------------------------------------------------------------------
    def _tracks(self) -> bool:
        """Whether an operation on this tensor must be recorded for autograd."""
        return self.requires_grad and is_grad_enabled()

    def view(self, *shape) -> Tensor:
        shape = self._infer_shape(shape)
        if not self.is_contiguous():
            raise ValueError(f"view(): a tensor with shape {self._shape} and strides "
                             f"{self._strides} is not contiguous; use reshape() or "
                             ".contiguous().view()")
        return _shape.Reshape.apply(self, shape) if self._tracks() else self._reshape_raw(shape)

    def reshape(self, *shape) -> Tensor:
        shape = self._infer_shape(shape)
        t = self if self.is_contiguous() else self.contiguous()
        return _shape.Reshape.apply(t, shape) if t._tracks() else t._reshape_raw(shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        s, e = _wrap_dim(start_dim, self.ndim), _wrap_dim(end_dim, self.ndim)
        return self.reshape(self._shape[:s] + (math.prod(self._shape[s:e + 1]),) + self._shape[e + 1:])

    def permute(self, *dims) -> Tensor:
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        dims = tuple(_wrap_dim(d, self.ndim) for d in dims)
        if sorted(dims) != list(range(self.ndim)):
            raise ValueError(f"permute(): {dims} is not a permutation of the {self.ndim} "
                             f"dimensions of a tensor of shape {self._shape}")
        return _shape.Permute.apply(self, dims) if self._tracks() else self._permute_raw(dims)

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        d0, d1 = _wrap_dim(dim0, self.ndim), _wrap_dim(dim1, self.ndim)
        dims = list(range(self.ndim))
        dims[d0], dims[d1] = dims[d1], dims[d0]
        return self.permute(dims)

    def t(self) -> Tensor:
        if self.ndim > 2:
            raise ValueError(f"t() expects a tensor with <= 2 dimensions, got {self.ndim}")
        return self if self.ndim < 2 else self.transpose(0, 1)

    @property
    def T(self) -> Tensor:
        return self.permute(*reversed(range(self.ndim)))

    @property
    def mT(self) -> Tensor:
        return self.transpose(-2, -1)

    def unsqueeze(self, dim: int) -> Tensor:
        d = _wrap_dim(dim, self.ndim + 1)
        return self[(slice(None),) * d + (None,)]

    def squeeze(self, dim: int | None = None) -> Tensor:
        if dim is None:
            key = tuple(0 if n == 1 else slice(None) for n in self._shape)
        else:
            d = _wrap_dim(dim, self.ndim)
            key = (slice(None),) * d + ((0,) if self._shape[d] == 1 else ())
        return self[key]

    def expand(self, *shape) -> Tensor:
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if len(shape) < self.ndim:
            raise ValueError(f"expand(): cannot expand shape {self._shape} to {shape}")
        if tuple(shape) == self._shape:
            return self
        return _shape.Expand.apply(self, shape) if self._tracks() else self._expand_raw(shape)

    def expand_as(self, other: Tensor) -> Tensor:
        return self.expand(other.shape)

    def narrow(self, dim: int, start: int, length: int) -> Tensor:
        d = _wrap_dim(dim, self.ndim)
        if start < 0:
            start += self._shape[d]
        if not (0 <= start and length >= 0 and start + length <= self._shape[d]):
            raise IndexError(f"narrow(): [{start}, {start + length}) is out of range for "
                             f"dimension {d} of size {self._shape[d]}")
        return self[(slice(None),) * d + (slice(start, start + length),)]

    def split(self, split_size, dim: int = 0) -> list:
        d = _wrap_dim(dim, self.ndim)
        n = self._shape[d]
        if isinstance(split_size, int):
            if split_size <= 0:
                raise ValueError(f"split(): split_size must be > 0, got {split_size}")
            sizes = [builtins.min(split_size, n - i) for i in range(0, n, split_size)] or [0]
        else:
            sizes = list(split_size)
            if builtins.sum(sizes) != n:
                raise ValueError(f"split(): sizes {sizes} do not add up to {n} (dimension {d})")
        out, at = [], 0
        for s in sizes:
            out.append(self.narrow(d, at, s))
            at += s
        return out

    def chunk(self, chunks: int, dim: int = 0) -> list:
        n = self._shape[_wrap_dim(dim, self.ndim)]
        return self.split(builtins.max(1, -(-n // chunks)), dim)

    def unbind(self, dim: int = 0) -> tuple:
        d = _wrap_dim(dim, self.ndim)
        return tuple(self.select(d, i) for i in range(self._shape[d]))

    def select(self, dim: int, index: int) -> Tensor:
        d = _wrap_dim(dim, self.ndim)
        return self[(slice(None),) * d + (index,)]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    def __getitem__(self, key) -> Tensor:
        found = _advanced_index(self, key)
        if found is not None:  # an index tensor, list or bool mask: PyTorch's advanced indexing
            y, dim, index = found
            if index.dtype is _dt.bool:  # the mask's dims become one, of the selected positions
                m = index.ndim
                if tuple(index.shape) != tuple(y.shape[dim:dim + m]):
                    raise IndexError(f"a mask of shape {tuple(index.shape)} does not match the indexed "
                                     f"dimensions {tuple(y.shape[dim:dim + m])}")
                y = y.reshape(y.shape[:dim] + (-1,) + y.shape[dim + m:])
                return y.index_select(dim, index.reshape(-1).nonzero().reshape(-1))
            out = y.index_select(dim, index.reshape(-1))
            return out.reshape(y.shape[:dim] + tuple(index.shape) + y.shape[dim + 1:])
        return _shape.Index.apply(self, key) if self._tracks() else self._getitem_raw(key)

    def __setitem__(self, key, value) -> None:
        self._check_inplace("item assignment")
        found = _advanced_index(self, key)
        if found is None:
            memory.copy_into(self._getitem_raw(key), value)
            return
        y, dim, index = found  # y: a view of self, so writes into it land in self
        if index.dtype is _dt.bool and (not isinstance(value, Tensor) or value.ndim == 0):
            # x[mask] = number: one masked fill, the mask aligned with the dims it indexes
            y.masked_fill_(index.reshape(tuple(index.shape) + (1,) * (y.ndim - dim - index.ndim)), value)
            return
        if index.dtype is _dt.bool:
            positions = [tuple(p) for p in index.nonzero().tolist()]
            rows = [y[(slice(None),) * dim + p] for p in positions]
        else:
            rows = [y.select(dim, int(i)) for i in index.reshape(-1).tolist()]
        values = value if isinstance(value, Tensor) else None
        for j, row in enumerate(rows):  # one copy per selected position (x[idx] = v, x[mask] = v)
            if values is not None and values.ndim and values.shape[0] == len(rows) and len(rows) > 1:
                memory.copy_into(row, values[j])
            else:
                memory.copy_into(row, value)

    def index_select(self, dim: int, index: Tensor) -> Tensor:
        return _idx.index_select(self, dim, index)

    def gather(self, dim: int, index: Tensor) -> Tensor:
        return _idx.gather(self, dim, index)

    # ---- copies and conversion -------------------------------------------------------------
    def contiguous(self) -> Tensor:
        if self.is_contiguous():
            return self
        return _shape.Clone.apply(self) if self._tracks() else self._clone_raw()

    def clone(self) -> Tensor:
        return _shape.Clone.apply(self) if self._tracks() else self._clone_raw()

    def __deepcopy__(self, memo) -> Tensor:
        """copy.deepcopy of a leaf (as PyTorch): new memory, the same requires_grad and a copy
        of .grad; what deep-copies a Module (nn.TransformerEncoder clones its layer so)."""
        if not self.is_leaf:
            raise RuntimeError("only tensors created by the user (graph leaves) can be deep-copied; "
                               "deep-copy .detach() instead")
        import copy
        out = self._clone_raw()
        out.requires_grad = self.requires_grad
        if self.grad is not None:
            out.grad = copy.deepcopy(self.grad, memo)
        memo[id(self)] = out
        return out

    def _check_inplace(self, what: str) -> None:
        if self.requires_grad and is_grad_enabled():
            raise RuntimeError(f"{what} on a tensor that requires grad would bypass autograd; "
                               "do it under infinitrain.no_grad() or on .detach()")
        if any(s == 0 and n > 1 for n, s in zip(self._shape, self._strides)):
            raise RuntimeError(f"{what}: more than one element of the written-to tensor refers "
                               "to a single memory location (an expanded view); call .clone() "
                               "first")

    def copy_(self, src, non_blocking: builtins.bool = False) -> Tensor:
        """Copies src into this tensor (broadcasting src, converting its dtype). non_blocking, as
        PyTorch's: a copy between pinned host memory and a GPU of the same dtype and layout is
        queued on the current stream and returns at once (the host side must not be read or
        changed until the stream has passed it); any other copy is made as without it."""
        self._check_inplace("copy_()")
        memory.copy_into(self, src, non_blocking)
        return self

    def pin_memory(self) -> Tensor:
        """A copy of this CPU tensor in pinned (page-locked) host memory, or itself when it is
        pinned already (PyTorch's): what a non_blocking copy to or from a GPU needs."""
        if self.device.type != "cpu":
            raise RuntimeError(f"pin_memory(): the tensor is on {self.device}; only host memory is pinned")
        if self.is_pinned():
            return self
        out = _empty(self.shape, self.dtype, self.device, pinned=True)
        memory.copy_into(out, self)
        return out

    def is_pinned(self) -> builtins.bool:
        return self._storage.is_pinned

    def fill_(self, value) -> Tensor:
        self._check_inplace("fill_()")
        memory.copy_into(self, value)
        return self

    def zero_(self) -> Tensor:
        return self.fill_(0)

    def masked_fill_(self, mask: Tensor, value) -> Tensor:
        self._check_inplace("masked_fill_()")
        memory.copy_into(self, _idx.masked_fill(self.detach(), mask, value))
        return self

    def backward(self, gradient=None, retain_graph: bool = False) -> None:
        from .autograd import backward
        backward(self, gradient, retain_graph=retain_graph)

    def to(self, *args, dtype=None, device=None, copy: bool = False) -> Tensor:
        dtype, device = to_arguments(args, dtype, device)
        dtype = self.dtype if dtype is None else dtype
        device = self.device if device is None else device
        if dtype is self.dtype and device == self.device and not copy:
            return self
        if device == self.device and self._tracks():
            return _ops.Convert.apply(self, dtype) if dtype is not self.dtype else self.clone()
        return memory.convert(self, dtype, device)

    def type(self, dtype) -> Tensor:
        return self.to(dtype)

    def float(self) -> Tensor:
        return self.to(_dt.float32)

    def double(self) -> Tensor:
        return self.to(_dt.float64)

    def bfloat16(self) -> Tensor:
        return self.to(_dt.bfloat16)

    def half(self) -> Tensor:
        return self.to(_dt.float16)

    def long(self) -> Tensor:
        return self.to(_dt.int64)

    def int(self) -> Tensor:
        return self.to(_dt.int32)

    def bool(self) -> Tensor:
        return self.to(_dt.bool)

    def cpu(self) -> Tensor:
        return self.to(device="cpu")

    def is_floating_point(self) -> builtins.bool:
        return self.dtype.is_floating_point

    # ---- arithmetic ----------------------------------------------------------------------
    def __add__(self, other):
        return _ops.add(self, other)

    def __radd__(self, other):
        return _ops.add(self, other)

    def __sub__(self, other):
        return _ops.sub(self, other)

    def __rsub__(self, other):
        return _ops.rsub(self, other)

    def __mul__(self, other):
        return _ops.mul(self, other)

    def __rmul__(self, other):
        return _ops.mul(self, other)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule sharing this tensor's memory (numpy.from_dlpack, torch.from_dlpack,
        cupy.from_dlpack read it without a copy; copy=True hands over a copy): infinitrain.dlpack."""
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"__dlpack__: this tensor is on {self.device}; move it with .to() first")
        return _dlpack.to_dlpack(self.clone() if copy else self, stream, max_version)

    def __dlpack_device__(self) -> tuple:
        return _dlpack.dlpack_device(self)

    def __truediv__(self, other):
        return _ops.div(self, other)

    def __rtruediv__(self, other):
        return _ops.rdiv(self, other)

    def __floordiv__(self, other):
        return _idx.floor_divide(self, other)

    def __rfloordiv__(self, other):
        return _idx.rfloor_divide(self, other)

    def floor_divide(self, other):
        return _idx.floor_divide(self, other)

    def __pow__(self, other):
        return _ops.pow(self, other)

    def __rpow__(self, other):
        return _ops.rpow(self, other)

    def __neg__(self):
        return _ops.unary(lib.IT_NEG, self) if self.dtype.is_floating_point else _ops.mul(self, -1)

    def neg(self):
        return -self

    def __matmul__(self, other):
        return _ops.matmul(self, other)

    def __rmatmul__(self, other):
        return _ops.matmul(other, self)

    def __iadd__(self, other):
        return self.add_(other)

    def __isub__(self, other):
        return self.sub_(other)

    def __imul__(self, other):
        return self.mul_(other)

    def __itruediv__(self, other):
        return self.div_(other)

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

    def _inplace(self, result: Tensor, what: str):
        """self = result (computed out of place, then written back in self's dtype)."""
        self._check_inplace(what)
        memory.copy_into(self, result)
        return self

    def add_(self, other, alpha: float = 1.0):
        return self._inplace(_ops.add(self.detach(), other if alpha == 1.0 else other * alpha), "add_()")

    def sub_(self, other):
        return self._inplace(_ops.sub(self.detach(), other), "sub_()")

    def mul_(self, other):
        return self._inplace(_ops.mul(self.detach(), other), "mul_()")

    def div_(self, other):
        if not self.dtype.is_floating_point:
            raise TypeError(f"div_() of a {self.dtype.name} tensor would need a float result")
        return self._inplace(_ops.div(self.detach(), other), "div_()")

    def clamp_(self, min=None, max=None):  # noqa: A002
        return self._inplace(_ops.clamp(self.detach(), min, max), "clamp_()")

    def add(self, other, alpha: float = 1.0):
        return _ops.add(self, other if alpha == 1.0 else other * alpha)

    def sub(self, other):
        return _ops.sub(self, other)

    def mul(self, other):
        return _ops.mul(self, other)

    def div(self, other):
        return _ops.div(self, other)

    def pow(self, other):
        return _ops.pow(self, other)

    def matmul(self, other):
        return _ops.matmul(self, other)

    def mm(self, other):
        if self.ndim != 2 or not isinstance(other, Tensor) or other.ndim != 2:
            raise ValueError("mm(): both operands must be 2-D")
        return _ops.matmul(self, other)

    def bmm(self, other):
        if self.ndim != 3 or not isinstance(other, Tensor) or other.ndim != 3 \
                or other.shape[0] != self.shape[0]:
            raise ValueError("bmm(): both operands must be 3-D with the same batch size, got "
                             f"{tuple(self.shape)} and {tuple(getattr(other, 'shape', ()))}")
        return _ops.matmul(self, other)

    def maximum(self, other):
        return _ops.maximum(self, other, True)

    def minimum(self, other):
        return _ops.maximum(self, other, False)

    def clamp(self, min=None, max=None):  # noqa: A002
        return _ops.clamp(self, min, max)

    clip = clamp

    def where(self, condition, other):
        return _idx.where(condition, self, other)

    def masked_fill(self, mask, value):
        return _idx.masked_fill(self, mask, value)

    def exp(self):
        return _ops.unary(lib.IT_EXP, self)

    def log(self):
        return _ops.unary(lib.IT_LOG, self)

    def sqrt(self):
        return _ops.unary(lib.IT_SQRT, self)

    def rsqrt(self):
        return _ops.unary(lib.IT_RSQRT, self)

    def abs(self):
        return _ops.unary(lib.IT_ABS, self)

    def tanh(self):
        return _ops.unary(lib.IT_TANH, self)

    def sigmoid(self):
        return _ops.unary(lib.IT_SIGMOID, self)

    def relu(self):
        return _ops.unary(lib.IT_RELU, self)

    def sin(self):
        return _ops.unary(lib.IT_SIN, self)

    def cos(self):
        return _ops.unary(lib.IT_COS, self)

    def square(self):
        return _ops.unary(lib.IT_SQUARE, self)

    def reciprocal(self):
        return _ops.unary(lib.IT_RECIPROCAL, self)

    def tril(self, diagonal: int = 0):
        return _ops.triangle(self, diagonal, False)

    def triu(self, diagonal: int = 0):
        return _ops.triangle(self, diagonal, True)

    # ---- reductions ----------------------------------------------------------------------
    def sum(self, dim=None, keepdim: builtins.bool = False, *, dtype=None):
        return _ops.sum(self if dtype is None else self.to(dtype=dtype), dim, keepdim)

    def mean(self, dim=None, keepdim: builtins.bool = False):
        return _ops.mean(self, dim, keepdim)

    def max(self, dim=None, keepdim: builtins.bool = False):
        return _ops.extreme(self, dim, keepdim, True)

    def min(self, dim=None, keepdim: builtins.bool = False):
        return _ops.extreme(self, dim, keepdim, False)

    def amax(self, dim=(), keepdim: builtins.bool = False):
        return _ops.amax(self, dim, keepdim, True)

    def amin(self, dim=(), keepdim: builtins.bool = False):
        return _ops.amax(self, dim, keepdim, False)

    def argmax(self, dim=None, keepdim: builtins.bool = False):
        from .kernels.reduce import arg_extreme
        return arg_extreme(self, dim, keepdim, True)

    def argmin(self, dim=None, keepdim: builtins.bool = False):
        from .kernels.reduce import arg_extreme
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

    # ---- PyTorch conveniences built from the ops above ----------------------------------
    def new_zeros(self, *size, dtype=None, device=None, requires_grad: builtins.bool = False):
        from .creation import zeros
        return zeros(*size, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)

    def new_ones(self, *size, dtype=None, device=None, requires_grad: builtins.bool = False):
        from .creation import ones
        return ones(*size, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)

    def new_tensor(self, data, dtype=None, device=None, requires_grad: builtins.bool = False):
        from .creation import tensor
        return tensor(data, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)

    def sign(self):
        """-1, 0 or 1 in this tensor's dtype (no gradient: it is piecewise constant)."""
        x = self.detach()
        return ((x > 0).to(dtype=self.dtype) - (x < 0).to(dtype=self.dtype))

    def flip(self, *dims):
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        out = self
        for d in dims:
            n = self.shape[_wrap_dim(d, self.ndim)]
            out = out.index_select(d, _positions(list(range(n - 1, -1, -1)), self.device))
        return out

    def roll(self, shifts, dims=None):
        if dims is None:
            return self.flatten().roll(shifts, 0).reshape(self.shape)
        shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        if len(shifts) != len(dims):
            raise ValueError(f"roll: {len(shifts)} shifts for {len(dims)} dims")
        out = self
        for shift, d in zip(shifts, dims):
            n = self.shape[_wrap_dim(d, self.ndim)]
            if n:
                out = out.index_select(d, _positions([(i - shift) % n for i in range(n)], self.device))
        return out

    def repeat(self, *sizes):
        sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
        if len(sizes) < self.ndim:
            raise ValueError(f"repeat: {len(sizes)} sizes for a tensor of {self.ndim} dimensions")
        x = self.reshape((1,) * (len(sizes) - self.ndim) + tuple(self.shape))
        inter = []  # [r0, n0, r1, n1, ...] expanded, then merged pairwise
        for r, n in zip(sizes, x.shape):
            inter += [r, n]
        expanded = x.reshape(tuple(v for n in x.shape for v in (1, n))).expand(*inter)
        return expanded.reshape(tuple(r * n for r, n in zip(sizes, x.shape)))

    def nonzero(self, *, as_tuple: builtins.bool = False):
        """The indices of the non-zero elements, [n, ndim] int64 (read on the host)."""
        import numpy as np
        from .creation import tensor
        idx = np.argwhere(self.detach()._host().numpy() != 0)
        if as_tuple:
            return tuple(tensor(idx[:, d], dtype=_dt.int64, device=self.device) for d in range(self.ndim))
        return tensor(idx.reshape(-1, self.ndim), dtype=_dt.int64, device=self.device)

    # in-place draws and maths, as PyTorch's (no autograd through them: a leaf that requires
    # grad is refused, as for every in-place write)
    def _draw_(self, what: str, fill):
        self._check_inplace(f"{what}()")
        target = self if self.is_contiguous() else self._clone_raw()
        fill(target)
        return self if target is self else self.copy_(target)

    def uniform_(self, a: float = 0.0, b: float = 1.0, generator=None):
        from .random import default_generator
        return self._draw_("uniform_", lambda t: (generator or default_generator).fill_uniform(t, a, b))

    def normal_(self, mean: float = 0.0, std: float = 1.0, generator=None):
        from .random import default_generator
        return self._draw_("normal_", lambda t: (generator or default_generator).fill_normal(t, mean, std))

    def exp_(self):
        return self.copy_(self.exp())

    def sqrt_(self):
        return self.copy_(self.sqrt())

    def retain_grad(self):
        """Keeps this non-leaf tensor's gradient in .grad after backward (a leaf keeps its own)."""
        if self.is_leaf or not self.requires_grad:
            return

        def keep(g):
            self.grad = g if self.grad is None else self.grad + g
        self.register_hook(keep)

    def all(self):
        return self.bool().logical_not().float().sum() == 0

    def any(self):
        return self.bool().float().sum() > 0


def to_arguments(args, dtype=None, device=None):
    """(dtype or None, device or None) from to()'s positional arguments (a dtype, a device,
    both, or a tensor to match) and keywords: what Tensor.to and Module.to accept."""
    for a in args:
        if isinstance(a, _dt.dtype) or (isinstance(a, str) and a in _dt._BY_NAME):
            dtype = a
        elif isinstance(a, (str, Device)):
            device = a
        elif isinstance(a, Tensor):
            dtype, device = a.dtype, a.device
        else:
            raise TypeError(f"to() takes a dtype, a device or a tensor, got {a!r}")
    return (None if dtype is None else _dt.as_dtype(dtype)), (None if device is None else as_device(device))


def _logical(a: Tensor, b, op: int) -> Tensor:
    """and / or of bool tensors (min / max of 0-1 values)."""
    from .kernels.elementwise import binary
    if not isinstance(b, Tensor) or a.dtype is not _dt.bool or b.dtype is not _dt.bool:
        raise TypeError("& and | are defined for two bool tensors here")
    return binary(op, a, b)


_CLASS_INTERNALS = {"__dict__", "__weakref__", "__module__", "__doc__", "__qualname__",
                    "__firstlineno__", "__static_attributes__"}
for _name, _member in vars(TensorMethods).items():
    if _name not in _CLASS_INTERNALS:
        setattr(Tensor, _name, _member)
# numpy defers to Tensor's reflected operators (np.float32(2) * x is a Tensor, not an array)
Tensor.__array_ufunc__ = None
