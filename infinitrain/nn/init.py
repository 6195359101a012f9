"""In-place initialisers (torch.nn.init)."""
from __future__ import annotations

import math
from contextlib import contextmanager

from ..autograd import no_grad
from ..random import default_generator

_deferred = [False]


@contextmanager
def deferred():
    """Inside, random initialisers fill zeros and draw nothing: a model that initialises every
    parameter itself afterwards builds its modules here, so that what it draws does not depend
    on how many modules this rank built (a pipeline stage builds only its own)."""
    previous, _deferred[0] = _deferred[0], True
    try:
        yield
    finally:
        _deferred[0] = previous


def _fill(tensor, fill):
    """Runs fill(target) on the tensor's memory, through a contiguous copy if it is strided. A
    tensor-parallel shard is filled with its part of a full-size draw, so that every layout
    starts from the values one process would have."""
    shard = getattr(tensor, "tp_shard", None)
    if shard is not None:
        from ..tensor import _empty
        full = _empty(shard.full_shape(tensor.shape), tensor.dtype, tensor.device)
        fill(full)
        tensor.copy_(shard.take(full))
    elif tensor.is_contiguous():
        fill(tensor.detach())
    else:
        from ..tensor import _empty
        tmp = _empty(tensor.shape, tensor.dtype, tensor.device)
        fill(tmp)
        tensor.copy_(tmp)
    return tensor


@no_grad()
def normal_(tensor, mean: float = 0.0, std: float = 1.0, generator=None):
    if _deferred[0]:
        return tensor.fill_(0)
    g = generator or default_generator
    return _fill(tensor, lambda t: g.fill_normal(t, mean, std))


@no_grad()
def uniform_(tensor, a: float = 0.0, b: float = 1.0, generator=None):
    if _deferred[0]:
        return tensor.fill_(0)
    g = generator or default_generator
    return _fill(tensor, lambda t: g.fill_uniform(t, a, b))


@no_grad()
def zeros_(tensor):
    return tensor.fill_(0)


@no_grad()
def ones_(tensor):
    return tensor.fill_(1)


@no_grad()
def constant_(tensor, value: float):
    return tensor.fill_(value)


def kaiming_uniform_linear_(weight, generator=None):
    """PyTorch's default Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    shard = getattr(weight, "tp_shard", None)
    fan_in = shard.full_shape(weight.shape)[1] if shard is not None else weight.shape[1]
    bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
    return uniform_(weight, -bound, bound, generator)
