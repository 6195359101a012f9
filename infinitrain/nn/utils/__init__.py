"""Gradient utilities (torch.nn.utils), and nn.utils.rnn."""
from __future__ import annotations

import math

import numpy as np

from ..._native import lib
from ...creation import from_numpy
from ...autograd import no_grad, zero_grads  # noqa: F401  (zero_grads re-exported)
from ...device import as_device
from ...dtypes import float64
from ...kernels import elementwise as ew
from ...kernels import reduce as kred
from ...kernels.memory import cat, convert
from . import rnn  # noqa: F401  (nn.utils.rnn, as torch's)


def squared_norm(tensors, device):
    """float64 [1] on device: the sum of the squares of every element of tensors, each summed
    where it is (in float32, as one process does), the host reading nothing."""
    parts = [convert(kred.reduce(lib.IT_SUM, ew.unary(lib.IT_SQUARE, t.float())), float64).reshape(1)
             for t in tensors]
    zero = from_numpy(np.zeros(1)).to(device)
    return ew.add(zero, kred.reduce(lib.IT_SUM, cat(parts))).reshape(1) if parts else zero


@no_grad()
def total_norm(pairs, device, dp_group=None, pipeline_group=None, expert_group=None) -> float:
    """The one-process 2-norm of the gradients in pairs [(parameter, gradient)], whatever the
    layout: a tensor-parallel shard holds part of its parameter, so the shards' squares are
    summed over their TP group, while replicated parameters (equal on every rank) count once; a
    pipeline stage's copy of a tied parameter is left out (the original counts); dp_group: the
    gradients are ZeRO's shards, each rank holding other elements, so the squares are summed
    over it; pipeline_group: each stage holds other parameters, so they are summed over it;
    expert_group: the EP ranks, each holding other experts (parameters marked
    `expert_parallel`), whose squares are summed over it.
    Summed where the gradients are, in float64; the host reads one number at the end."""
    replicated, shards = [], {}
    for p, g in pairs:
        if getattr(p, "tied_copy_of", None) is not None:
            continue
        shard = getattr(p, "tp_shard", None)
        if expert_group is not None and getattr(p, "expert_parallel", False):
            shards.setdefault(id(expert_group), (expert_group, []))[1].append(g)
        elif shard is None:
            replicated.append(g)
        else:
            shards.setdefault(id(shard.group), (shard.group, []))[1].append(g)
    parts = cat([squared_norm(replicated, device)] + [squared_norm(gs, device) for _, gs in shards.values()])
    if dp_group is not None and dp_group.size > 1:
        dp_group.all_reduce(parts)
    for k, (group, _) in enumerate(shards.values(), start=1):
        mine = parts[k:k + 1].clone()
        group.all_reduce(mine)
        parts[k:k + 1].copy_(mine)
    total = kred.reduce(lib.IT_SUM, parts).reshape(1).contiguous()
    if pipeline_group is not None and pipeline_group.size > 1:
        pipeline_group.all_reduce(total)
    return math.sqrt(float(total.item()))


@no_grad()
def clip_grad_value_(parameters, clip_value: float) -> None:
    """Clamps every gradient to [-clip_value, clip_value] in place (torch.nn.utils.clip_grad_value_)."""
    if not clip_value >= 0:
        raise ValueError(f"clip_grad_value_: clip_value must be >= 0, got {clip_value}")
    for p in ([parameters] if hasattr(parameters, "grad") else parameters):
        if p.grad is not None:
            p.grad.clamp_(-clip_value, clip_value)


@no_grad()
def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, pipeline_group=None, expert_group=None) -> float:
    """Scales gradients so that their global 2-norm is at most max_norm; returns the norm
    before clipping (as torch.nn.utils.clip_grad_norm_). Under tensor parallelism the norm is
    the one-process norm (total_norm); under pipeline parallelism pass the pipeline's group,
    under expert parallelism the EP group."""
    if norm_type != 2.0:
        raise NotImplementedError("clip_grad_norm_: only the 2-norm is implemented")
    params = [p for p in parameters if p.grad is not None]
    grads = [p.grad for p in params]
    if not grads and pipeline_group is None:
        return 0.0
    from ..parallel.expert_parallel import require_expert_group
    require_expert_group(params, expert_group, "clip_grad_norm_", "expert_group")
    device = grads[0].device if grads else as_device("cpu")
    total = total_norm(zip(params, grads), device, pipeline_group=pipeline_group, expert_group=expert_group)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"the total norm of the gradients is {total}; set "
                           "error_if_nonfinite=False to clip anyway")
    scale_(grads, max_norm, total)
    return total


def clip_coef(max_norm: float, total: float) -> float | None:
    """The factor clipping multiplies the gradients by (max_norm / total), or None when the norm
    is within max_norm and they stay as they are."""
    coef = max_norm / (total + 1e-6)
    return coef if coef < 1.0 else None


@no_grad()
def scale_(grads, max_norm: float, total: float) -> None:
    """Scales grads by max_norm / total when the norm exceeds max_norm (clipping's last step)."""
    coef = clip_coef(max_norm, total)
    if coef is not None:
        for g in grads:
            g.mul_(coef)
