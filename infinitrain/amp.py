"""Automatic mixed precision: autocast(dtype=bfloat16).

Inside the context, matrix products (linear, matmul, attention) run with bfloat16 inputs and
float32 accumulation; normalisation and softmax run in float32; elementwise ops on mixed
dtypes compute in float32 (so a float32 residual stream stays float32); cross-entropy reads
bfloat16 logits and accumulates in float32. Parameters stay float32 (master weights): their
bfloat16 copies are made per use and gradients flow back to them in float32, so the optimizer
state is float32 too.
"""
from __future__ import annotations

import threading
from . import dtypes as _dt

_state = threading.local()


def autocast_dtype():
    """The active autocast dtype, or None."""
    return getattr(_state, "dtype", None)


class autocast:
    def __init__(self, dtype=None, enabled: bool = True):
        dtype = _dt.bfloat16 if dtype is None else _dt.as_dtype(dtype)
        if dtype not in (_dt.bfloat16, _dt.float16, _dt.float32):
            raise TypeError(f"autocast: dtype must be bfloat16 (or float16/float32), got {dtype}")
        self.dtype = dtype if enabled and dtype is not _dt.float32 else None

    def __enter__(self):
        self._prev = autocast_dtype()
        _state.dtype = self.dtype
        return self

    def __exit__(self, *exc):
        _state.dtype = self._prev
        return False


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
