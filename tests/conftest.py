import numpy as np
import pytest

import infinitrain as it


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 and back to float32 (the reference for bf16 inputs)."""
    import ml_dtypes
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def to_np(t) -> np.ndarray:
    """A float32 (or integer) numpy copy of a tensor."""
    a = t.numpy()
    return a.astype(np.float32) if t.dtype is it.bfloat16 else np.array(a)


def numerical_grad(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar f(x) in float64."""
    x = x.astype(np.float64)
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        fp = f(x)
        flat[i] = old - eps
        fm = f(x)
        flat[i] = old
        gflat[i] = (fp - fm) / (2 * eps)
    return g
