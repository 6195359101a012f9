"""Tensor methods that copy or convert: contiguous, clone, deepcopy, pinned memory (pin_memory,
is_pinned), to() and its dtype and device shorthands (type, type_as, float, double, bfloat16, half, long,
int, bool, cpu), is_floating_point, the DLPack protocol (__dlpack__, __dlpack_device__),
new_zeros / new_ones / new_tensor, __format__; and `to_arguments`, the reading of to()'s arguments that
Tensor.to and Module.to share."""
from __future__ import annotations

import builtins
from .. import dtypes as _dt
from ..device import as_device
from ..device import device as Device
from .. import dlpack as _dlpack
from ..kernels import memory
from ..ops import math as _ops
from ..ops import shape as _shape
from ..tensor import Tensor, _empty


class ConversionMethods:
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

    def type_as(self, other: Tensor) -> Tensor:
        return self.to(other.dtype)

    def __format__(self, format_spec: str) -> str:
        """f"{loss:.4f}": a 0-d tensor formats as its number; others only with an empty spec (PyTorch's)."""
        if self.ndim == 0:
            return format(self.item(), format_spec)
        return object.__format__(self, format_spec)

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

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule sharing this tensor's memory (numpy.from_dlpack, torch.from_dlpack,
        cupy.from_dlpack read it without a copy; copy=True hands over a copy): infinitrain.dlpack."""
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"__dlpack__: this tensor is on {self.device}; move it with .to() first")
        return _dlpack.to_dlpack(self.clone() if copy else self, stream, max_version)

    def __dlpack_device__(self) -> tuple:
        return _dlpack.dlpack_device(self)

    def new_zeros(self, *size, dtype=None, device=None, requires_grad: builtins.bool = False):
        from ..creation import zeros
        return zeros(*size, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)

    def new_ones(self, *size, dtype=None, device=None, requires_grad: builtins.bool = False):
        from ..creation import ones
        return ones(*size, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)

    def new_tensor(self, data, dtype=None, device=None, requires_grad: builtins.bool = False):
        from ..creation import tensor
        return tensor(data, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)


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
