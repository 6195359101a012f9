"""Gradient utilities."""
from __future__ import annotations

import math

from .._native import lib
from ..autograd import no_grad, zero_grads  # noqa: F401  (zero_grads re-exported)
from ..kernels import elementwise as ew


@no_grad()
def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> float:
    """Scales gradients so that their global 2-norm is at most max_norm; returns the norm
    before clipping (as torch.nn.utils.clip_grad_norm_)."""
    if norm_type != 2.0:
        raise NotImplementedError("clip_grad_norm_: only the 2-norm is implemented")
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    total = math.sqrt(sum(ew.reduce(lib.IT_SUM, ew.unary(lib.IT_SQUARE, g.float())).item() for g in grads))
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"the total norm of the gradients is {total}; set "
                           "error_if_nonfinite=False to clip anyway")
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return total
