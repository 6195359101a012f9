"""torch.set_float32_matmul_precision / get_float32_matmul_precision, which
backends.cuda.matmul.allow_tf32 reads and writes as a flag."""
from __future__ import annotations

import warnings

_PRECISIONS = ("highest", "high", "medium")
_matmul_precision = ["highest"]  # one mutable cell shared by the two ways of setting it


def set_float32_matmul_precision(precision: str) -> None:
    """torch.set_float32_matmul_precision: 'highest', 'high' or 'medium'; anything else is
    ignored with a warning, as PyTorch does."""
    if precision not in _PRECISIONS:
        warnings.warn(f"{precision!r} is not one of 'highest', 'high' or 'medium'; "
                      "set_float32_matmul_precision() had no effect", UserWarning, stacklevel=2)
        return
    _matmul_precision[0] = precision


def get_float32_matmul_precision() -> str:
    return _matmul_precision[0]
