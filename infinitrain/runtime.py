"""Process-wide settings and counters of the native library: CPU threads, the caching
allocator's memory statistics, build information (as torch.set_num_threads and
torch.cuda.memory_stats)."""
from __future__ import annotations

from ._native import check, ffi, lib
from ._native import build_info as _build_info
from .device import as_device


def build_info() -> str:
    """The native library's version, BLAS, SIMD level picked for this CPU, and threads."""
    return _build_info()


def set_num_threads(n: int) -> None:
    """Threads used by CPU kernels (OpenMP and BLAS), like torch.set_num_threads."""
    check(lib.it_set_num_threads(n))


def get_num_threads() -> int:
    return lib.it_get_num_threads()


def memory_stats(device="cpu") -> dict:
    """Counters of the caching allocator: bytes in tensors, bytes held (tensors + cache), peaks."""
    out = ffi.new("it_memory_stats *")
    check(lib.it_memory_stats_get(as_device(device).native, out))
    return {name: getattr(out, name) for name in (
        "allocated_bytes", "peak_allocated_bytes", "reserved_bytes", "peak_reserved_bytes",
        "num_allocs", "num_cache_hits")}


def memory_allocated(device="cpu") -> int:
    return memory_stats(device)["allocated_bytes"]


def max_memory_allocated(device="cpu") -> int:
    return memory_stats(device)["peak_allocated_bytes"]


def reset_peak_memory_stats(device="cpu") -> None:
    check(lib.it_memory_reset_peak(as_device(device).native))


def empty_cache(device="cpu") -> None:
    """Returns cached free blocks to the system."""
    check(lib.it_memory_empty_cache(as_device(device).native))


def available_memory() -> int | None:
    """This node's available host memory (Linux's MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def check_fits_in_memory(nbytes: float, what: str, hint: str = "") -> None:
    """Raise MemoryError naming `what` when it would need more than this node's available
    memory: a size read from a flag or a file is bounded before anything is allocated for it
    (else a typo such as 3.2e19 grows the process until the kernel kills it)."""
    available = available_memory()
    if available is not None and nbytes > available:
        raise MemoryError(f"{what} would need {nbytes / 2**30:,.1f} GiB of memory; this machine has "
                          f"{available / 2**30:,.1f} GiB available" + (f". {hint}" if hint else ""))
