"""Tensor: shape, strides, offset, dtype and device over a native storage.

Views (view, reshape, transpose, permute, slicing, expand) only change the metadata; the
kernels want contiguous memory, so an operation on a strided view makes it contiguous first,
except where a kernel reads strides itself (binary ops, copies, matmul's transposes).
"""
from __future__ import annotations

import importlib
import builtins
import math
from typing import Iterable

import numpy as np

_dt = importlib.import_module("infinitrain.dtype")  # the module; infinitrain.dtype is the class
from ._native import check, ffi, int64_array, lib
from .device import CPU, as_device
from .device import device as Device
from .storage import Storage


def _contiguous_strides(shape) -> tuple:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _parse_size(size) -> tuple:
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    out = []
    for n in size:
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
            raise TypeError(f"sizes must be integers, got {type(n).__name__} in {size}")
        if n < 0:
            raise ValueError(f"negative dimension {n} in size {tuple(size)}")
        out.append(int(n))
    return tuple(out)


def _wrap_dim(dim: int, ndim: int, name: str = "dim") -> int:
    n = builtins.max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"{name} {dim} is out of range for a tensor with {ndim} dimensions")
    return dim % n


class _ArrayOwner:
    """Gives numpy a view of tensor memory while keeping the storage alive."""

    def __init__(self, storage: Storage, interface: dict):
        self.storage = storage
        self.__array_interface__ = interface


class Tensor:
    __slots__ = ("_storage", "_shape", "_strides", "_offset", "dtype", "requires_grad", "grad",
                 "grad_fn", "_output_nr", "_hooks", "_post_acc_hooks", "__weakref__")

    def __init__(self, *args, **kwargs):
        raise TypeError("create tensors with infinitrain.tensor(), empty(), zeros(), "
                        "from_numpy() and friends")

    @classmethod
    def _make(cls, storage: Storage, shape, strides, offset: int, dtype) -> "Tensor":
        t = object.__new__(cls)
        t._output_nr = 0
        t._hooks = None
        t._post_acc_hooks = None
        t._storage = storage
        t._shape = tuple(shape)
        t._strides = tuple(strides)
        t._offset = offset
        t.dtype = dtype
        t.requires_grad = False
        t.grad = None
        t.grad_fn = None
        return t

    # ---- metadata ----------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self._shape

    @property
    def device(self) -> Device:
        return self._storage.device

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel() * self.dtype.itemsize

    def size(self, dim: int | None = None):
        return self._shape if dim is None else self._shape[_wrap_dim(dim, self.ndim)]

    def dim(self) -> int:
        return len(self._shape)

    def numel(self) -> int:
        return math.prod(self._shape)

    def stride(self, dim: int | None = None):
        return self._strides if dim is None else self._strides[_wrap_dim(dim, self.ndim)]

    def storage_offset(self) -> int:
        return self._offset

    def element_size(self) -> int:
        return self.dtype.itemsize

    def is_contiguous(self) -> bool:
        expected = 1
        for n, s in zip(reversed(self._shape), reversed(self._strides)):
            if n != 1 and s != expected:
                return False
            expected *= n
        return True

    def data_ptr(self) -> int:
        return self._storage.ptr + self._offset * self.dtype.itemsize

    def _ptr(self):
        """The address of the first element, as a void* for native calls."""
        return ffi.cast("void *", self.data_ptr())

    # ---- views -------------------------------------------------------------------------
    def _view(self, shape, strides, offset=None) -> "Tensor":
        return Tensor._make(self._storage, shape, strides,
                            self._offset if offset is None else offset, self.dtype)

    def _infer_shape(self, shape) -> tuple:
        shape = list(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) \
            else list(shape)
        numel = self.numel()
        if shape.count(-1) > 1:
            raise ValueError(f"only one dimension can be -1, got {tuple(shape)}")
        if -1 in shape:
            rest = math.prod(n for n in shape if n != -1)
            if rest == 0 or numel % rest:
                raise ValueError(f"shape {tuple(shape)} is invalid for a tensor of {numel} elements")
            shape[shape.index(-1)] = numel // rest
        shape = _parse_size(shape)
        if math.prod(shape) != numel:
            raise ValueError(f"shape {shape} is invalid for a tensor of shape {self._shape} "
                             f"({numel} elements)")
        return shape

    def _tracks(self) -> bool:
        """Whether an operation on this tensor must be recorded for autograd."""
        return self.requires_grad and is_grad_enabled()

    def _reshape_raw(self, shape) -> "Tensor":
        return self._view(shape, _contiguous_strides(shape))

    def _reshape_strided(self, *shape) -> "Tensor":
        """Splits the last dimension of a view whose last dimension is contiguous."""
        if self._strides[-1] != 1 or math.prod(shape[self.ndim - 1:]) != self._shape[-1]:
            raise ValueError(f"cannot split the last dimension of {self._shape} into {shape}")
        tail = shape[self.ndim - 1:]
        return self._view(self._shape[:-1] + tuple(tail),
                          self._strides[:-1] + _contiguous_strides(tail))

    def view(self, *shape) -> "Tensor":
        shape = self._infer_shape(shape)
        if not self.is_contiguous():
            raise ValueError(f"view(): a tensor with shape {self._shape} and strides "
                             f"{self._strides} is not contiguous; use reshape() or "
                             ".contiguous().view()")
        return _shape_ops.Reshape.apply(self, shape) if self._tracks() else self._reshape_raw(shape)

    def reshape(self, *shape) -> "Tensor":
        shape = self._infer_shape(shape)
        t = self if self.is_contiguous() else self.contiguous()
        return _shape_ops.Reshape.apply(t, shape) if t._tracks() else t._reshape_raw(shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        if self.ndim == 0:
            return self.reshape(1)
        s, e = _wrap_dim(start_dim, self.ndim), _wrap_dim(end_dim, self.ndim)
        return self.reshape(self._shape[:s] + (math.prod(self._shape[s:e + 1]),) + self._shape[e + 1:])

    def _permute_raw(self, dims) -> "Tensor":
        return self._view([self._shape[d] for d in dims], [self._strides[d] for d in dims])

    def permute(self, *dims) -> "Tensor":
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        dims = tuple(_wrap_dim(d, self.ndim) for d in dims)
        if sorted(dims) != list(range(self.ndim)):
            raise ValueError(f"permute(): {dims} is not a permutation of the {self.ndim} "
                             f"dimensions of a tensor of shape {self._shape}")
        return _shape_ops.Permute.apply(self, dims) if self._tracks() else self._permute_raw(dims)

    def transpose(self, dim0: int, dim1: int) -> "Tensor":
        d0, d1 = _wrap_dim(dim0, self.ndim), _wrap_dim(dim1, self.ndim)
        dims = list(range(self.ndim))
        dims[d0], dims[d1] = dims[d1], dims[d0]
        return self.permute(dims)

    def t(self) -> "Tensor":
        if self.ndim > 2:
            raise ValueError(f"t() expects a tensor with <= 2 dimensions, got {self.ndim}")
        return self if self.ndim < 2 else self.transpose(0, 1)

    @property
    def T(self) -> "Tensor":
        return self.permute(*reversed(range(self.ndim)))

    @property
    def mT(self) -> "Tensor":
        return self.transpose(-2, -1)

    def unsqueeze(self, dim: int) -> "Tensor":
        d = _wrap_dim(dim, self.ndim + 1)
        return self[(slice(None),) * d + (None,)]

    def squeeze(self, dim: int | None = None) -> "Tensor":
        if dim is None:
            key = tuple(0 if n == 1 else slice(None) for n in self._shape)
        else:
            d = _wrap_dim(dim, self.ndim)
            key = (slice(None),) * d + ((0,) if self._shape[d] == 1 else ())
        return self[key]

    def _expand_raw(self, shape) -> "Tensor":
        lead = len(shape) - self.ndim
        new_shape, new_strides = [], []
        for i, n in enumerate(shape):
            if i < lead:
                if n < 0:
                    raise ValueError(f"expand(): -1 is not allowed for new dimension {i}")
                new_shape.append(n)
                new_strides.append(0)
                continue
            have, stride = self._shape[i - lead], self._strides[i - lead]
            if n == -1 or n == have:
                new_shape.append(have)
                new_strides.append(stride)
            elif have == 1:
                new_shape.append(n)
                new_strides.append(0)
            else:
                raise ValueError(f"expand(): cannot expand shape {self._shape} to {tuple(shape)} "
                                 f"(dimension {i}: {have} -> {n})")
        return self._view(new_shape, new_strides)

    def expand(self, *shape) -> "Tensor":
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if len(shape) < self.ndim:
            raise ValueError(f"expand(): cannot expand shape {self._shape} to {shape}")
        if tuple(shape) == self._shape:
            return self
        return _shape_ops.Expand.apply(self, shape) if self._tracks() else self._expand_raw(shape)

    def expand_as(self, other: "Tensor") -> "Tensor":
        return self.expand(other.shape)

    def narrow(self, dim: int, start: int, length: int) -> "Tensor":
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
            if sum(sizes) != n:
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

    def select(self, dim: int, index: int) -> "Tensor":
        d = _wrap_dim(dim, self.ndim)
        return self[(slice(None),) * d + (index,)]

    def __getitem__(self, key) -> "Tensor":
        if isinstance(key, Tensor):
            return _shape_ops.Gather.apply(self, key) if self._tracks() else self._index_select_raw(key)
        return _shape_ops.Index.apply(self, key) if self._tracks() else self._getitem_raw(key)

    def _getitem_raw(self, key) -> "Tensor":
        key = key if isinstance(key, tuple) else (key,)
        if builtins.sum(k is Ellipsis for k in key) > 1:
            raise IndexError("an index can only have one ellipsis")
        used = builtins.sum(1 for k in key if k is not None and k is not Ellipsis)
        if used > self.ndim:
            raise IndexError(f"too many indices ({used}) for a tensor of shape {self._shape}")
        if Ellipsis in key:
            i = key.index(Ellipsis)
            key = key[:i] + (slice(None),) * (self.ndim - used) + key[i + 1:]
        shape, strides, offset, d = [], [], self._offset, 0
        for k in key:
            if k is None:
                shape.append(1)
                strides.append(0)
                continue
            n, s = self._shape[d], self._strides[d]
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                if step <= 0:
                    raise ValueError("slices with a negative or zero step are not supported")
                length = builtins.max(0, -(-(stop - start) // step))
                shape.append(length)
                strides.append(s * step)
                offset += start * s if length else 0
            elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
                k = int(k)
                if not -n <= k < n:
                    raise IndexError(f"index {k} is out of range for dimension {d} of size {n}")
                offset += (k % n) * s
            else:
                raise TypeError(f"unsupported index {k!r} ({type(k).__name__}); use ints, "
                                "slices, None, ... or an integer tensor")
            d += 1
        shape += self._shape[d:]
        strides += self._strides[d:]
        return self._view(shape, strides, offset)

    def _index_select_raw(self, index: "Tensor") -> "Tensor":
        """t[idx] for an integer tensor idx: rows of t (along dimension 0) gathered."""
        from .kernels import nn
        if index.dtype not in (_dt.int32, _dt.int64):
            raise TypeError(f"tensors used as indices must be int32 or int64, got {index.dtype}")
        if self.ndim == 0:
            raise IndexError("cannot index a 0-d tensor with a tensor")
        rows = self.contiguous()._reshape_raw((self._shape[0], math.prod(self._shape[1:])))
        out = nn.embedding(rows, index.contiguous()._reshape_raw((index.numel(),)))
        return out._reshape_raw(index.shape + self._shape[1:])

    def __setitem__(self, key, value) -> None:
        self._check_inplace("item assignment")
        self._getitem_raw(key).copy_(value)

    # ---- copies and conversion -----------------------------------------------------------
    def _clone_raw(self) -> "Tensor":
        out = _empty(self._shape, self.dtype, self.device)
        out.copy_(self)
        return out

    def contiguous(self) -> "Tensor":
        if self.is_contiguous():
            return self
        return _shape_ops.Clone.apply(self) if self._tracks() else self._clone_raw()

    def clone(self) -> "Tensor":
        return _shape_ops.Clone.apply(self) if self._tracks() else self._clone_raw()

    def detach(self) -> "Tensor":
        return self._view(self._shape, self._strides)

    def _check_inplace(self, what: str) -> None:
        if self.requires_grad and is_grad_enabled():
            raise RuntimeError(f"{what} on a tensor that requires grad would bypass autograd; "
                               "do it under infinitrain.no_grad() or on .detach()")

    def copy_(self, src) -> "Tensor":
        """Copies src into this tensor (broadcasting src, converting its dtype)."""
        from .kernels import memory
        self._check_inplace("copy_()")
        memory.copy_into(self, src)
        return self

    def fill_(self, value) -> "Tensor":
        from .kernels import memory
        self._check_inplace("fill_()")
        memory.copy_into(self, value)
        return self

    def zero_(self) -> "Tensor":
        return self.fill_(0)

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        if requires_grad and not self.dtype.is_floating_point:
            raise TypeError(f"only floating-point tensors can require gradients, not {self.dtype.name}")
        self.requires_grad = requires_grad
        return self

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def data(self) -> "Tensor":
        return self.detach()

    def backward(self, gradient=None, retain_graph: bool = False) -> None:
        from .autograd import backward
        backward(self, gradient, retain_graph=retain_graph)

    def register_hook(self, hook):
        """hook(grad) runs when this tensor's gradient is computed; it may return a new one."""
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that does not require grad")
        if self.grad_fn is None:
            self._hooks = (self._hooks or []) + [hook]
        else:
            node = self.grad_fn
            node.hooks = node.hooks or {}
            node.hooks.setdefault(self._output_nr, []).append(hook)
        return hook

    def register_post_accumulate_grad_hook(self, hook):
        """hook(tensor) runs after a gradient was accumulated into this leaf's .grad."""
        if self.grad_fn is not None:
            raise RuntimeError("post-accumulate-grad hooks can only be registered on leaves")
        self._post_acc_hooks = (self._post_acc_hooks or []) + [hook]
        return hook

    def to(self, *args, dtype=None, device=None, copy: bool = False) -> "Tensor":
        for a in args:
            if isinstance(a, _dt.dtype) or (isinstance(a, str) and a in _dt._BY_NAME):
                dtype = a
            elif isinstance(a, (str, Device)):
                device = a
            else:
                raise TypeError(f"to() takes a dtype or a device, got {a!r}")
        dtype = self.dtype if dtype is None else _dt.as_dtype(dtype)
        device = self.device if device is None else as_device(device)
        if dtype is self.dtype and device == self.device and not copy:
            return self
        if device == self.device and self._tracks():
            return _shape_ops.Convert.apply(self, dtype)
        from .kernels import memory
        return memory.convert(self, dtype, device)

    def float(self) -> "Tensor":
        return self.to(_dt.float32)

    def bfloat16(self) -> "Tensor":
        return self.to(_dt.bfloat16)

    def half(self) -> "Tensor":
        return self.to(_dt.float16)

    def long(self) -> "Tensor":
        return self.to(_dt.int64)

    def int(self) -> "Tensor":
        return self.to(_dt.int32)

    def cpu(self) -> "Tensor":
        return self.to(device=CPU)

    def numpy(self) -> np.ndarray:
        """A numpy array sharing this tensor's memory (CPU only; bfloat16 as ml_dtypes)."""
        if self.device.type != "cpu":
            raise TypeError(f"numpy() needs a CPU tensor, this one is on {self.device}; "
                            "call .cpu() first")
        raw = self.dtype.numpy if self.dtype is not _dt.bfloat16 else np.dtype(np.uint16)
        interface = {
            "version": 3,
            "shape": self._shape,
            "typestr": raw.str,
            "data": (self.data_ptr(), False),
            "strides": tuple(s * self.itemsize for s in self._strides),
        }
        arr = np.asarray(_ArrayOwner(self._storage, interface))
        return arr.view(self.dtype.numpy) if self.dtype is _dt.bfloat16 else arr

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    def tolist(self):
        return self.numpy().tolist()

    def item(self):
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with one element, this one has shape "
                             f"{self._shape}")
        return self.numpy().reshape(()).item()

    def __float__(self):
        return builtins.float(self.item())

    def __int__(self):
        return builtins.int(self.item())

    def __bool__(self):
        return bool(self.item())

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def __iter__(self):
        return iter(self.unbind(0))

    def __repr__(self) -> str:
        body = np.array2string(np.asarray(self.numpy(), dtype=np.float32)
                               if self.dtype is _dt.bfloat16 else self.numpy(),
                               separator=", ", prefix="tensor(", threshold=200)
        extras = []
        if self.dtype not in (_dt.float32, _dt.int64):
            extras.append(f"dtype={self.dtype!r}")
        if self.device.type != "cpu":
            extras.append(f"device='{self.device}'")
        if self.grad_fn is not None:
            extras.append(f"grad_fn=<{self.grad_fn.name()}>")
        elif self.requires_grad:
            extras.append("requires_grad=True")
        return "tensor(" + body + "".join(", " + e for e in extras) + ")"

    # ---- arithmetic (differentiable, through infinitrain.ops) --------------------------
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

    def __truediv__(self, other):
        return _ops.div(self, other)

    def __rtruediv__(self, other):
        return _ops.rdiv(self, other)

    def __pow__(self, other):
        return _ops.pow(self, other)

    def __neg__(self):
        return _ops.unary(lib.IT_NEG, self)

    def __matmul__(self, other):
        return _ops.matmul(self, other)

    def __iadd__(self, other):
        return self.add_(other)

    def __isub__(self, other):
        return self.sub_(other)

    def __imul__(self, other):
        return self.mul_(other)

    def __itruediv__(self, other):
        return self.div_(other)

    def _inplace(self, op: int, scalar_op: int, other, what: str):
        """self = self op other, written straight into self's memory where it can be."""
        self._check_inplace(what)
        if self.is_contiguous() and (not isinstance(other, Tensor) or (
                other.dtype is self.dtype and other._storage is not self._storage)):
            if isinstance(other, Tensor):
                _ew.binary(op, self, other, out=self)
            else:
                _ew.scalar(scalar_op, self, other, out=self)
            return self
        return self.copy_(_ew.binary(op, self, other) if isinstance(other, Tensor)
                          else _ew.scalar(scalar_op, self, other))

    def add_(self, other, alpha: float = 1.0):
        if alpha != 1.0:
            other = other * alpha
        return self._inplace(lib.IT_ADD, lib.IT_SCALAR_ADD, other, "add_()")

    def sub_(self, other):
        return self._inplace(lib.IT_SUB, lib.IT_SCALAR_ADD,
                             other if isinstance(other, Tensor) else -other, "sub_()")

    def mul_(self, other):
        return self._inplace(lib.IT_MUL, lib.IT_SCALAR_MUL, other, "mul_()")

    def div_(self, other):
        if not self.dtype.is_floating_point:
            raise TypeError(f"div_() of a {self.dtype.name} tensor would need a float result")
        return self._inplace(lib.IT_DIV, lib.IT_SCALAR_DIV, other, "div_()")

    def add(self, other):
        return _ops.add(self, other)

    def sub(self, other):
        return _ops.sub(self, other)

    def mul(self, other):
        return _ops.mul(self, other)

    def div(self, other):
        return _ops.div(self, other)

    def matmul(self, other):
        return _ops.matmul(self, other)

    def maximum(self, other):
        return _ew.binary(lib.IT_MAXIMUM, self, other)

    def minimum(self, other):
        return _ew.binary(lib.IT_MINIMUM, self, other)

    def clamp(self, min=None, max=None):  # noqa: A002
        return _ops.clamp(self, min, max)

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

    # ---- reductions --------------------------------------------------------------------
    def sum(self, dim=None, keepdim: bool = False):
        return _ops.sum(self, dim, keepdim)

    def mean(self, dim=None, keepdim: bool = False):
        return _ops.mean(self, dim, keepdim)

    def max(self, dim=None, keepdim: bool = False):
        return _ew.reduce(lib.IT_MAX, self, dim, keepdim)

    def min(self, dim=None, keepdim: bool = False):
        return _ew.reduce(lib.IT_MIN, self, dim, keepdim)

    def argmax(self, dim=None, keepdim: bool = False):
        return _ew.argmax(self, dim, keepdim)

    def softmax(self, dim: int = -1):
        return _ops.softmax(self, dim)


def _empty(shape: Iterable[int], dtype: _dt.dtype, device: Device) -> Tensor:
    """A new contiguous tensor with uninitialised memory."""
    shape = tuple(shape)
    storage = Storage(math.prod(shape) * dtype.itemsize, device)
    return Tensor._make(storage, shape, _contiguous_strides(shape), 0, dtype)


# Below Tensor because they need it defined.
from .autograd.grad_mode import is_grad_enabled  # noqa: E402
from .kernels import elementwise as _ew  # noqa: E402
from .ops import math as _ops  # noqa: E402
from .ops import shape as _shape_ops  # noqa: E402
