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


# ---- PyTorch's fan-based initialisers ----------------------------------------------------------

def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """torch.nn.init.calculate_gain: the gain that keeps the variance of activations through
    the nonlinearity."""
    linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d", "sigmoid")
    if nonlinearity in linear:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def _fans(tensor) -> tuple:
    """(fan_in, fan_out) of a weight [out, in, *kernel], as torch's (the full tensor's, for a
    tensor-parallel shard)."""
    shard = getattr(tensor, "tp_shard", None)
    shape = shard.full_shape(tensor.shape) if shard is not None else tuple(tensor.shape)
    if len(shape) < 2:
        raise ValueError(f"fan in and fan out need a tensor of at least 2 dimensions, got shape {shape}")
    field = math.prod(shape[2:])
    return shape[1] * field, shape[0] * field


def xavier_uniform_(tensor, gain: float = 1.0, generator=None):
    fan_in, fan_out = _fans(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor, gain: float = 1.0, generator=None):
    fan_in, fan_out = _fans(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator)


def _kaiming_std(tensor, a, mode, nonlinearity) -> float:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"kaiming init: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = _fans(tensor)
    fan = fan_in if mode == "fan_in" else fan_out
    return calculate_gain(nonlinearity, a) / math.sqrt(fan) if fan else 0.0


def kaiming_uniform_(tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                     generator=None):
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                    generator=None):
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity), generator)


@no_grad()
def trunc_normal_(tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0, generator=None):
    """A normal(mean, std) truncated to [a, b] (torch.nn.init.trunc_normal_): draws outside the
    interval are drawn again, so the values have exactly that distribution."""
    import numpy as np
    from ..creation import from_numpy
    if not a < b:
        raise ValueError(f"trunc_normal_: a ({a}) must be below b ({b})")
    if _deferred[0]:
        return tensor.fill_(0)
    g = generator or default_generator
    n = tensor.numel()
    out = np.empty(n, np.float32)
    todo = np.arange(n)
    while todo.size:
        draw = from_numpy(np.empty(todo.size, np.float32))
        g.fill_normal(draw, mean, std)
        values = draw.numpy()
        keep = (values >= a) & (values <= b)
        out[todo[keep]] = values[keep]
        todo = todo[~keep]
    return tensor.copy_(from_numpy(out.reshape(tuple(tensor.shape))).to(dtype=tensor.dtype, device=tensor.device))


@no_grad()
def orthogonal_(tensor, gain: float = 1.0, generator=None):
    """A (semi-)orthogonal matrix (torch.nn.init.orthogonal_): the Q of the QR decomposition of a
    standard normal [rows, rest] draw (transposed when wider than tall), its columns' signs set
    by R's diagonal so that Q is uniformly distributed, times gain. rows = the first dimension,
    the rest flattened."""
    import numpy as np
    from ..creation import from_numpy
    if tensor.ndim < 2:
        raise ValueError(f"orthogonal_: only tensors with 2 or more dimensions are supported, got shape "
                         f"{tuple(tensor.shape)}")
    if _deferred[0] or tensor.numel() == 0:
        return tensor.fill_(0)
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    draw = from_numpy(np.empty((rows, cols), np.float32))
    (generator or default_generator).fill_normal(draw, 0.0, 1.0)
    flat = draw.numpy().astype(np.float64)
    wide = rows < cols
    q, r = np.linalg.qr(flat.T if wide else flat)
    q = q * np.sign(np.diag(r))  # the sign each column would have for a positive diagonal of R
    q = q.T if wide else q
    out = from_numpy(np.ascontiguousarray(gain * q, dtype=np.float32).reshape(tuple(tensor.shape)))
    return tensor.copy_(out.to(dtype=tensor.dtype, device=tensor.device))
