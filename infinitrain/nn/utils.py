"""Gradient utilities."""
from __future__ import annotations

import math

import numpy as np

from .._native import lib
from ..creation import from_numpy
from ..autograd import no_grad, zero_grads  # noqa: F401  (zero_grads re-exported)
from ..device import as_device
from ..dtype import float64
from ..kernels import elementwise as ew
from ..kernels.memory import cat, convert


def squared_norm(tensors, device):
    """float64 [1] on device: the sum of the squares of every element of tensors, each summed
    where it is (in float32, as one process does), the host reading nothing."""
    parts = [convert(ew.reduce(lib.IT_SUM, ew.unary(lib.IT_SQUARE, t.float())), float64).reshape(1)
             for t in tensors]
    zero = from_numpy(np.zeros(1)).to(device)
    return ew.add(zero, ew.reduce(lib.IT_SUM, cat(parts))).reshape(1) if parts else zero


@no_grad()
def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, pipeline_group=None) -> float:
    """Scales gradients so that their global 2-norm is at most max_norm; returns the norm
    before clipping (as torch.nn.utils.clip_grad_norm_). Under pipeline parallelism pass the
    pipeline's group: each stage holds other parameters, so their squares are summed over it
    (a stage's copy of a tied parameter is left out: the original counts)."""
    if norm_type != 2.0:
        raise NotImplementedError("clip_grad_norm_: only the 2-norm is implemented")
    params = [p for p in parameters if p.grad is not None]
    grads = [p.grad for p in params]
    if not grads and pipeline_group is None:
        return 0.0
    # A tensor-parallel shard holds part of its parameter: the shards' squares are summed over
    # their group; replicated parameters (equal on every rank) count once, as in one process.
    # Summed where the gradients are, in float64; the host reads one number at the end.
    replicated, shards = [], {}
    for p, g in zip(params, grads):
        if getattr(p, "tied_copy_of", None) is not None:
            continue
        shard = getattr(p, "tp_shard", None)
        if shard is None:
            replicated.append(g)
        else:
            shards.setdefault(id(shard.group), (shard.group, []))[1].append(g)
    device = grads[0].device if grads else as_device("cpu")
    total_t = squared_norm(replicated, device)
    for group, parts in shards.values():
        t = squared_norm(parts, device).contiguous()
        group.all_reduce(t)
        total_t = ew.add(total_t, t)
    if pipeline_group is not None and pipeline_group.size > 1:
        total_t = total_t.contiguous()
        pipeline_group.all_reduce(total_t)
    total_sq = float(total_t.sum().item())
    total = math.sqrt(total_sq)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"the total norm of the gradients is {total}; set "
                           "error_if_nonfinite=False to clip anyway")
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return total
