"""Tensor: shape, strides, offset, dtype and device over a native storage.

This module is the bottom of the Python core: the data and its metadata, the raw (not
recorded) views, numpy interop. The user-facing methods (views that autograd records,
arithmetic, reductions, conversions) are attached from above by `tensor_methods`, so that
nothing here imports the kernels, autograd or the ops built on them.

Views only change the metadata; the kernels want contiguous memory, so an operation on a
strided view makes it contiguous first, except where a kernel reads strides itself (binary
ops, copies, matmul's transposes).
"""
from __future__ import annotations

import builtins
import math
from typing import Iterable

import numpy as np
from . import dtypes as _dt
from ._native import check, ffi, int64_array, lib
from .device import CPU
from .device import device as Device
from .size import Size
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
                 "grad_fn", "_output_nr", "_hooks", "_post_acc_hooks", "_base", "__weakref__")

    def __init__(self, *args, **kwargs):
        raise TypeError("create tensors with infinitrain.tensor(), empty(), zeros(), "
                        "from_numpy() and friends")

    @classmethod
    def _make(cls, storage: Storage, shape, strides, offset: int, dtype) -> "Tensor":
        t = object.__new__(cls)
        t._output_nr = 0
        t._hooks = None
        t._post_acc_hooks = None
        t._base = None  # for a recorded view: the tensor it views (in-place writes re-base it)
        t._storage = storage
        t._shape = Size(shape)
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

    def _reshape_raw(self, shape) -> "Tensor":
        """A view in the new shape; a strided input (expand, permute, slices) is copied first,
        since contiguous strides over its memory would read the wrong elements."""
        t = self if self.is_contiguous() else self._clone_raw()
        return t._view(shape, _contiguous_strides(shape))

    def _reshape_strided(self, *shape) -> "Tensor":
        """Splits the last dimension of a view whose last dimension is contiguous."""
        if self._strides[-1] != 1 or math.prod(shape[self.ndim - 1:]) != self._shape[-1]:
            raise ValueError(f"cannot split the last dimension of {self._shape} into {shape}")
        tail = shape[self.ndim - 1:]
        return self._view(self._shape[:-1] + tuple(tail),
                          self._strides[:-1] + _contiguous_strides(tail))

    def _permute_raw(self, dims) -> "Tensor":
        return self._view([self._shape[d] for d in dims], [self._strides[d] for d in dims])

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

    # ---- copies and conversion -----------------------------------------------------------
    def _clone_raw(self) -> "Tensor":
        """A contiguous copy, not recorded by autograd."""
        out = _empty(self._shape, self.dtype, self.device)
        check(lib.it_copy_strided(self.device.native, self.dtype.native, out._ptr(),
                                  int64_array(out._strides), self._ptr(),
                                  int64_array(self._strides), int64_array(self._shape),
                                  self.ndim))
        return out

    def _contiguous_raw(self) -> "Tensor":
        return self if self.is_contiguous() else self._clone_raw()

    def _unsqueeze_raw(self, dim: int) -> "Tensor":
        d = _wrap_dim(dim, self.ndim + 1)
        return self._view(self._shape[:d] + (1,) + self._shape[d:],
                          self._strides[:d] + (0,) + self._strides[d:])

    def _squeeze_raw(self, dim: int) -> "Tensor":
        d = _wrap_dim(dim, self.ndim)
        if self.ndim == 0 or self._shape[d] != 1:
            return self
        return self._view(self._shape[:d] + self._shape[d + 1:],
                          self._strides[:d] + self._strides[d + 1:])

    def detach(self) -> "Tensor":
        return self._view(self._shape, self._strides)

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

    def numpy(self) -> np.ndarray:
        """A numpy array sharing this tensor's memory (CPU only; bfloat16 as ml_dtypes)."""
        if self.requires_grad:  # as PyTorch: writes through the array would bypass autograd
            raise RuntimeError("Can't call numpy() on a tensor that requires grad; use "
                               "tensor.detach().numpy()")
        return self._array()

    def _array(self) -> np.ndarray:
        """numpy()'s array without the autograd check, for reading (item, tolist, repr)."""
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

    @property
    def __cuda_array_interface__(self) -> dict:
        """CUDA tensors are handed to other GPU libraries (CuPy, Numba, PyTorch) without a copy.
        The data is ready on this thread's current stream of the device, which the consumer
        must order its own work after (version 3 carries no stream)."""
        if self.device.type != "cuda":
            raise AttributeError("__cuda_array_interface__ is for CUDA tensors; this one is on the CPU")
        typestr = np.dtype(np.uint16).str if self.dtype is _dt.bfloat16 else self.dtype.numpy.str
        self._storage.exported()  # writable (the False of "data"), for as long as the consumer likes
        return {"version": 3, "shape": self._shape, "typestr": typestr, "data": (self.data_ptr(), False),
                "strides": tuple(s * self.itemsize for s in self._strides)}

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    def _host(self) -> "Tensor":
        """This tensor, or for a CUDA tensor a contiguous CPU copy (waits for the device)."""
        if self.device.type == "cpu":
            return self
        src = self._contiguous_raw()
        out = _empty(self._shape, self.dtype, CPU)
        check(lib.it_memcpy(CPU.native, out._ptr(), self.device.native, src._ptr(), out.nbytes))
        return out

    def tolist(self):
        return self._host()._array().tolist()

    def item(self):
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with one element, this one has shape "
                             f"{self._shape}")
        return self._host()._array().reshape(()).item()

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

    def __repr__(self) -> str:
        host = self._host()._array()
        values = np.asarray(host, dtype=np.float32) if self.dtype is _dt.bfloat16 else host
        formatter = {"float_kind": _float_formatter(values)} if self.dtype.is_floating_point else None
        body = np.array2string(values, separator=", ", prefix="tensor(", threshold=200, formatter=formatter)
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
    # ---- reductions --------------------------------------------------------------------
def _float_formatter(values: np.ndarray):
    """PyTorch's default float printing: whole numbers as "3.", else 4 decimals, or scientific
    notation with 4 when the finite magnitudes span more than 1000x, pass 1e8 or go below 1e-4."""
    finite = np.abs(values[np.isfinite(values)]).astype(np.float64)
    nonzero = finite[finite != 0]

    def special(v):
        return "nan" if np.isnan(v) else ("inf" if v > 0 else "-inf")
    if finite.size and np.all(finite == np.ceil(finite)):  # whole numbers
        if nonzero.size and nonzero.max() > 1e8:
            return lambda v: f"{v:.4e}" if np.isfinite(v) else special(v)
        return lambda v: f"{v:.0f}." if np.isfinite(v) else special(v)
    sci = nonzero.size and (nonzero.max() / nonzero.min() > 1000 or nonzero.max() > 1e8 or nonzero.min() < 1e-4)
    if sci:
        return lambda v: f"{v:.4e}" if np.isfinite(v) else special(v)
    return lambda v: f"{v:.4f}" if np.isfinite(v) else special(v)


def _empty(shape: Iterable[int], dtype: _dt.dtype, device: Device, pinned: bool = False) -> Tensor:
    """A new contiguous tensor with uninitialised memory (pinned: in page-locked host memory)."""
    shape = tuple(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    storage = Storage.pinned(nbytes) if pinned else Storage(nbytes, device)
    return Tensor._make(storage, shape, _contiguous_strides(shape), 0, dtype)
