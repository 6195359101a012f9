"""infinitrain: a training engine with a C/CUDA core and a PyTorch-shaped Python API."""
from __future__ import annotations

from ._native import (InvalidArgumentError, NativeError, NoCudaError, NotSupportedError, check,
                      ffi, lib)
from ._native import build_info as _build_info
from .creation import (arange, empty, empty_like, from_numpy, full, full_like, ones, ones_like,
                       rand, randn, tensor, zeros, zeros_like)
from .device import device
from .dtype import (bfloat16, dtype, float, float16, float32, half, int, int32, int64, long,
                    uint8)
from .ops.math import matmul
from .ops.shape import cat, stack
from .random import Generator, default_generator, initial_seed, manual_seed
from .tensor import Tensor
from .autograd import enable_grad, is_grad_enabled, no_grad, set_grad_enabled  # noqa: E402
from . import amp, nn, optim  # noqa: E402
from .amp import autocast  # noqa: E402

__version__ = "0.1.0"


def build_info() -> str:
    """The native library's version, BLAS, SIMD level picked for this CPU, and threads."""
    return _build_info()


def set_num_threads(n: int) -> None:
    """Threads used by CPU kernels (OpenMP and BLAS), like torch.set_num_threads."""
    check(lib.it_set_num_threads(n))


def get_num_threads() -> int:
    return lib.it_get_num_threads()


def tril(t: Tensor, diagonal: int = 0) -> Tensor:
    from .kernels.memory import triangle
    return triangle(t, diagonal, upper=False)


def triu(t: Tensor, diagonal: int = 0) -> Tensor:
    from .kernels.memory import triangle
    return triangle(t, diagonal, upper=True)


def memory_stats(device_: str | device = "cpu") -> dict:
    """Counters of the caching allocator: bytes in tensors, bytes held (tensors + cache), peaks."""
    from .device import as_device
    out = ffi.new("it_memory_stats *")
    check(lib.it_memory_stats_get(as_device(device_).native, out))
    return {name: getattr(out, name) for name in (
        "allocated_bytes", "peak_allocated_bytes", "reserved_bytes", "peak_reserved_bytes",
        "num_allocs", "num_cache_hits")}


def memory_allocated(device_="cpu") -> int:
    return memory_stats(device_)["allocated_bytes"]


def max_memory_allocated(device_="cpu") -> int:
    return memory_stats(device_)["peak_allocated_bytes"]


def reset_peak_memory_stats(device_="cpu") -> None:
    from .device import as_device
    check(lib.it_memory_reset_peak(as_device(device_).native))


def empty_cache(device_="cpu") -> None:
    """Returns cached free blocks to the system."""
    from .device import as_device
    check(lib.it_memory_empty_cache(as_device(device_).native))


__all__ = [
    "Tensor", "dtype", "device", "Generator", "NativeError", "InvalidArgumentError",
    "NotSupportedError", "NoCudaError", "float32", "float", "bfloat16", "float16", "half",
    "int32", "int", "int64", "long", "uint8", "empty", "zeros", "ones", "full", "arange", "rand",
    "randn", "tensor", "from_numpy", "empty_like", "zeros_like", "ones_like", "full_like",
    "manual_seed", "initial_seed", "default_generator", "matmul", "cat", "stack", "tril", "triu",
    "set_num_threads", "get_num_threads", "build_info", "memory_stats", "memory_allocated",
    "max_memory_allocated", "reset_peak_memory_stats", "empty_cache", "no_grad", "enable_grad",
    "is_grad_enabled", "set_grad_enabled", "nn", "optim", "amp", "autocast",
]
