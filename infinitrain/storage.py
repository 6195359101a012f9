"""Storage: one block of device memory from the native caching allocator, or wrapped memory
that someone else owns (a numpy array), kept alive for as long as any tensor views it."""
from __future__ import annotations

from ._native import check, ffi, lib
from .device import device as Device


class Storage:
    # version: bumped by every in-place write through a tensor method, so that autograd can tell
    # that a tensor it saved for backward was changed since (through it, a view or .detach())
    # aliases: how many other libraries may write the memory now, having been handed it (DLPack:
    # until the consumer lets go; __cuda_array_interface__: for good, its consumer never says);
    # alias_version: moves each time one is handed it or lets go. Their writes move no version
    # (autograd, as PyTorch's, does not see them); the offloaded optimizer's host masters look at
    # these two as well
    __slots__ = ("handle", "ptr", "nbytes", "device", "_keepalive", "version", "aliases", "alias_version",
                 "__weakref__")

    def __init__(self, nbytes: int, device: Device):
        out = ffi.new("it_storage **")
        check(lib.it_storage_new(device.native, nbytes, out))
        self._init(out[0], nbytes, device, None)

    def _init(self, raw, nbytes, device, keepalive):
        self.handle = ffi.gc(raw, lib.it_storage_free)
        self.ptr = int(ffi.cast("uintptr_t", lib.it_storage_data(raw)))
        self.nbytes = nbytes
        self.device = device
        self._keepalive = keepalive
        # allocate() starts it again: ZeRO-3 refills released memory with the same values, the
        # same way each time, so a tensor saved between two refills still reads as unchanged
        self.version = 0
        self.aliases = self.alias_version = 0

    def exported(self) -> None:
        """This memory is handed to another library, which may write it behind every version."""
        self.aliases += 1
        self.alias_version += 1

    def unexported(self) -> None:
        """A library handed this memory lets go of it (having maybe written it until now)."""
        self.aliases = max(0, self.aliases - 1)  # (0 if the storage took new memory since)
        self.alias_version += 1

    def release(self, why: str) -> None:
        """Gives the memory back now, while tensors still view this storage (ZeRO-3 frees a
        sharded parameter between uses this way); any use of them raises RuntimeError(why)
        until allocate() gives the storage memory again."""
        self.handle, self.ptr, self.nbytes, self._keepalive = None, _Released(why), 0, None

    def allocate(self, nbytes: int) -> None:
        """New memory of nbytes (contents undefined) for this storage and every tensor that
        views it; the old memory is given back."""
        out = ffi.new("it_storage **")
        check(lib.it_storage_new(self.device.native, nbytes, out))
        self._init(out[0], nbytes, self.device, None)

    def __reduce__(self):
        """Pickles as its bytes and device (a copy, never the native handle), so that tensors
        pickle for multiprocessing and tensors viewing one storage still share it after."""
        if self.is_released:
            raise RuntimeError(f"cannot pickle a released storage: {self.ptr.why}")
        data = bytearray(self.nbytes)
        if self.nbytes:
            check(lib.it_memcpy(Device("cpu").native, ffi.from_buffer(data), self.device.native,
                                ffi.cast("void *", self.ptr), self.nbytes))
        return (_rebuild_storage, (bytes(data), str(self.device)))

    @property
    def is_released(self) -> bool:
        return isinstance(self.ptr, _Released)

    @classmethod
    def pinned(cls, nbytes: int) -> "Storage":
        """Page-locked host memory (a CPU storage the GPUs' copy engines reach directly, so that
        a non_blocking copy to or from it runs beside kernels). Needs a CUDA device."""
        out = ffi.new("it_storage **")
        check(lib.it_storage_new_pinned(nbytes, out))
        self = cls.__new__(cls)
        self._init(out[0], nbytes, Device("cpu"), None)
        return self

    @property
    def is_pinned(self) -> bool:
        return self.handle is not None and bool(lib.it_storage_is_pinned(self.handle))

    @classmethod
    def wrap(cls, address: int, nbytes: int, device: Device, keepalive) -> "Storage":
        """Memory at `address` owned by `keepalive` (never freed by the library)."""
        out = ffi.new("it_storage **")
        check(lib.it_storage_wrap(device.native, ffi.cast("void *", address), nbytes, out))
        self = cls.__new__(cls)
        self._init(out[0], nbytes, device, keepalive)
        return self


def _rebuild_storage(data: bytes, device: str) -> Storage:
    storage = Storage(len(data), Device(device))
    if data:
        check(lib.it_memcpy(storage.device.native, ffi.cast("void *", storage.ptr), Device("cpu").native,
                            ffi.from_buffer(data), len(data)))
    return storage


class _Released:
    """The address of released memory: reading it (data_ptr(), a collective's buffer) raises
    a clear error instead of touching memory that is gone."""
    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why

    def __add__(self, other):
        raise RuntimeError(self.why)

    __radd__ = __add__
