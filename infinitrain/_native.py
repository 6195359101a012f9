"""The cffi binding to libinfinitrain (ABI mode).

The declarations come from the installed public header, the one source of truth for the C ABI:
the block between its IT_CDEF_BEGIN and IT_CDEF_END markers is plain C that cffi parses.
"""
from __future__ import annotations

import os
import site
import sys
from pathlib import Path

import cffi

_PKG_DIR = Path(__file__).resolve().parent
_LIB_NAME = "libinfinitrain.dylib" if sys.platform == "darwin" else "libinfinitrain.so"


def _candidate_dirs() -> list[Path]:
    """Where an install may have put lib/ and include/: next to this file (wheel install), in
    site-packages (editable installs keep compiled files there while the Python sources stay in
    the checkout), or a developer's CMake build tree."""
    dirs = [_PKG_DIR]
    roots = list(site.getsitepackages()) + [site.getusersitepackages()]
    roots += [p for p in sys.path if p.endswith("site-packages")]
    dirs += [Path(r) / "infinitrain" for r in roots]
    return dirs


def _find(env_var: str, rel: str, dev_fallback: Path) -> Path:
    forced = os.environ.get(env_var)
    if forced:
        if not Path(forced).is_file():
            raise ImportError(f"{env_var}={forced} does not name a file")
        return Path(forced)
    for d in _candidate_dirs():
        if (d / rel).is_file():
            return d / rel
    if dev_fallback.is_file():
        return dev_fallback
    raise ImportError(
        f"infinitrain: cannot find {rel} (looked next to {_PKG_DIR} and in site-packages). "
        "Install the package with `pip install .` (or `pip install -e .`) so that the native "
        f"library is built, or point {env_var} at it."
    )


def _read_cdef(header: Path) -> str:
    text = header.read_text()
    try:
        begin = text.index("/* IT_CDEF_BEGIN */") + len("/* IT_CDEF_BEGIN */")
        end = text.index("/* IT_CDEF_END */")
    except ValueError:
        raise ImportError(f"{header} has no IT_CDEF_BEGIN/IT_CDEF_END block") from None
    return text[begin:end]


LIBRARY_PATH = _find("INFINITRAIN_LIBRARY", f"lib/{_LIB_NAME}",
                     _PKG_DIR.parent / "build" / _LIB_NAME)
HEADER_PATH = _find("INFINITRAIN_HEADER", "include/infinitrain.h",
                    _PKG_DIR.parent / "native" / "include" / "infinitrain.h")

# OpenMP threads that spin after a parallel region steal the cores from OpenBLAS's own
# (pthreads) workers that run the next matrix product, and the other way round: measured on a
# GPT-2 step, passive waiting is ~40% faster. libgomp reads this when it loads, which is now.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The same the other way round: OpenBLAS's workers spin for 2^28 cycles (~0.1 s) after each
# product unless told otherwise, through the OpenMP kernels between products (attention, GELU,
# LayerNorm, AdamW), which then run at about half speed. 2^4 cycles: GPT-2 fp32 steps on 2
# threads 5-9% faster. OpenBLAS reads this when it loads, with this library, just below.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

ffi = cffi.FFI()
ffi.cdef(_read_cdef(HEADER_PATH))
lib = ffi.dlopen(str(LIBRARY_PATH))


class NativeError(RuntimeError):
    """An error reported by libinfinitrain; the message is the library's own."""


class InvalidArgumentError(NativeError, ValueError):
    pass


class NativeOutOfMemoryError(NativeError, MemoryError):
    pass


class NotSupportedError(NativeError, NotImplementedError):
    pass


class NoCudaError(NativeError):
    pass


class NativeIndexError(NativeError, IndexError):
    pass


_ERRORS = {
    lib.IT_ERR_INVALID_ARGUMENT: InvalidArgumentError,
    lib.IT_ERR_OUT_OF_MEMORY: NativeOutOfMemoryError,
    lib.IT_ERR_NOT_SUPPORTED: NotSupportedError,
    lib.IT_ERR_NO_CUDA: NoCudaError,
    lib.IT_ERR_INDEX_OUT_OF_RANGE: NativeIndexError,
}


def check(status: int) -> None:
    """Raise the library's error for a non-zero status."""
    if status != 0:
        message = ffi.string(lib.it_last_error()).decode(errors="replace")
        raise _ERRORS.get(status, NativeError)(message)


def int64_array(values) -> "ffi.CData":
    return ffi.new("int64_t[]", [int(v) for v in values])


def build_info() -> str:
    return ffi.string(lib.it_build_info()).decode()
