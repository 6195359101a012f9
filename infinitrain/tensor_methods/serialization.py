"""Tensor.__reduce_ex__: tensors (and Parameters) pickle in memory, for copy, multiprocessing
and DataLoader workers. A tensor pickles as its storage (bytes and device, see
Storage.__reduce__), its view of it, dtype and requires_grad; never the native handles. Views of
one storage in one pickle share that storage again after loading, as in PyTorch. As in PyTorch,
.grad is not pickled, and a non-leaf tensor comes back as a leaf with its requires_grad."""
from __future__ import annotations

import math

from ..tensor import Tensor


class PickleMethods:
    def __reduce_ex__(self, protocol):
        return (_rebuild_tensor, (type(self), self._storage, self._offset, self._shape, self._strides,
                                  self.dtype, self.requires_grad))


def _rebuild_tensor(cls, storage, offset: int, shape: tuple, strides: tuple, dtype, requires_grad: bool) -> Tensor:
    numel = math.prod(shape)
    end = offset + sum((n - 1) * s for n, s in zip(shape, strides)) + 1 if numel else 0
    if offset < 0 or min(strides, default=0) < 0 or end * dtype.itemsize > storage.nbytes:
        raise ValueError(f"a pickled tensor of shape {tuple(shape)} (strides {tuple(strides)}, offset {offset}) "
                         f"does not fit its storage of {storage.nbytes} bytes")
    t = Tensor._make(storage, shape, strides, offset, dtype)
    if cls is Tensor:
        t.requires_grad = requires_grad
        return t
    return cls(t, requires_grad)  # a Parameter
