"""Automatic mixed precision: autocast("cuda" or "cpu", dtype=bfloat16), as torch.autocast.
GradScaler (torch.amp.GradScaler) works on gradients, so it lives in optim/grad_scaler.py and
is attached here as amp.GradScaler by the package's __init__.

Inside the context, matrix products (linear, matmul, attention) run with bfloat16 inputs and
float32 accumulation; normalisation and softmax run in float32; elementwise ops on mixed
dtypes compute in float32 (so a float32 residual stream stays float32); cross-entropy reads
bfloat16 logits and accumulates in float32. Parameters stay float32 (master weights) and
gradients flow back to them in float32, so the optimizer state is float32 too. Their bfloat16
copies are cached as PyTorch's autocast does (cache_enabled): a parameter (a leaf that requires
grad) is cast once per outermost autocast region, however often it is used there; the cache is
emptied when the region ends, and an entry is not used once the parameter or its copy has been
written in place since (the storage's version).
"""
from __future__ import annotations

import functools
import threading
from contextlib import contextmanager

from . import dtypes as _dt

_state = threading.local()


def autocast_dtype():
    """The active autocast dtype, or None."""
    return getattr(_state, "dtype", None)


@contextmanager
def dtype_set(dtype):
    """The engine's own switch: inside, autocast lowers to dtype (None: off). autocast is the
    user's form; this one replays a recorded dtype (recompute) or turns autocast off for a piece
    that rounds by hand (tensor-parallel layers)."""
    previous = autocast_dtype()
    _state.dtype = dtype
    try:
        yield
    finally:
        _state.dtype = previous


class autocast:
    """torch.autocast(device_type, dtype=None, enabled=True, cache_enabled=None). device_type is
    'cpu' or 'cuda'; the engine autocasts the ops of every device alike. dtype None means
    bfloat16 on both (the engine's autocast dtype; PyTorch's CUDA default would be float16);
    float32 leaves autocast off. cache_enabled (default True) keeps each parameter's cast for the
    outermost region (the module's docstring)."""

    def __init__(self, device_type: str, dtype=None, enabled: bool = True, cache_enabled: bool | None = None):
        if isinstance(device_type, _dt.dtype) or device_type in _dt._BY_NAME:
            name = getattr(device_type, "name", device_type)
            raise TypeError(f"autocast's first argument is the device type, as PyTorch's: write "
                            f"autocast(\"cpu\", dtype={name}) (or \"cuda\"), not autocast({name})")
        if not isinstance(device_type, str) or device_type.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"autocast: device_type must be 'cpu' or 'cuda', got {device_type!r}")
        dtype = _dt.bfloat16 if dtype is None else _dt.as_dtype(dtype)
        if dtype not in (_dt.bfloat16, _dt.float16, _dt.float32):
            raise TypeError(f"autocast: dtype must be bfloat16 (or float16/float32), got {dtype}")
        self.device = device_type.split(":")[0]
        self.fast_dtype = dtype
        self.dtype = dtype if enabled and dtype is not _dt.float32 else None
        self.cache_enabled = True if cache_enabled is None else bool(cache_enabled)

    def __enter__(self):
        self._context = dtype_set(self.dtype)
        self._context.__enter__()
        self._outermost = getattr(_state, "cache", None) is None
        if self._outermost and self.dtype is not None and self.cache_enabled:
            _state.cache = {}
        return self

    def __exit__(self, *exc):
        self._context.__exit__(*exc)
        if self._outermost:
            _state.cache = None
        return False

    def __call__(self, fn):
        """As a decorator: fn runs inside this autocast."""
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with autocast(self.device, self.fast_dtype, self.dtype is not None):
                return fn(*args, **kwargs)
        return wrapped


def cached_cast(x, dtype, cast):
    """cast(x, dtype), or the copy of it already made in this autocast region: for a float32
    parameter (a leaf that requires grad) cast to the autocast dtype, the cache's rule. A new
    tensor object each time (autograd gives each use its own node), sharing the copy's memory."""
    cache = getattr(_state, "cache", None)
    if cache is None or dtype is not autocast_dtype() or x.dtype is not _dt.float32 or not x.requires_grad \
            or x.grad_fn is not None:
        return cast(x, dtype)
    key = (id(x), dtype)  # the entry holds x: the id stays x's while the region lasts
    hit = cache.get(key)
    if hit is not None:
        source, storage, version, low, low_version = hit
        if source is x and x._storage is storage and storage.version == version \
                and low._storage.version == low_version:
            cast_cache_hits[0] += 1
            return low.detach()
    low = cast(x, dtype)
    cache[key] = (x, x._storage, x._storage.version, low, low._storage.version)
    return low.detach()


cast_cache_hits = [0]  # casts the cache saved, in this process (what the tests count)


def lower(*tensors):
    """Matrix-product inputs under autocast: float32 tensors in the autocast dtype."""
    dt = autocast_dtype()
    if dt is None:
        return tensors
    return tuple(t.to(dt) if t is not None and t.dtype is _dt.float32 else t for t in tensors)


def full(*tensors):
    """Inputs of precision-sensitive ops under autocast: 16-bit tensors in float32."""
    if autocast_dtype() is None:
        return tensors
    return tuple(t.to(_dt.float32) if t is not None and t.dtype in (_dt.bfloat16, _dt.float16) else t
                 for t in tensors)
