"""The torch.* functional forms (infinitrain.where, infinitrain.cat, ...): thin entry points
over the Tensor methods and ops, so that `it.where(c, a, b)` reads as it does in PyTorch."""
from __future__ import annotations

from .kernels import index as _kidx
from .ops import index as _idx
from .ops import math as _ops
from .ops.shape import cat, stack  # noqa: F401  (re-exported)
from .random import default_generator
from .tensor import Tensor


def matmul(a: Tensor, b: Tensor) -> Tensor:
    return _ops.matmul(a, b)


def mm(a: Tensor, b: Tensor) -> Tensor:
    return a.mm(b)


def bmm(a: Tensor, b: Tensor) -> Tensor:
    return a.bmm(b)


def where(condition: Tensor, input, other) -> Tensor:
    return _idx.where(condition, input, other)


def masked_fill(input: Tensor, mask: Tensor, value) -> Tensor:
    return _idx.masked_fill(input, mask, value)


def gather(input: Tensor, dim: int, index: Tensor) -> Tensor:
    return _idx.gather(input, dim, index)


def index_select(input: Tensor, dim: int, index: Tensor) -> Tensor:
    return _idx.index_select(input, dim, index)


def cumsum(input: Tensor, dim: int) -> Tensor:
    return _idx.cumsum(input, dim)


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):  # noqa: A002
    return _idx.topk(input, k, dim, largest, sorted)


def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *,
                generator=None) -> Tensor:
    """Indices drawn from the rows of non-negative weights (torch.multinomial); for sampling
    from a language model: multinomial(softmax(logits), 1)."""
    return _kidx.multinomial(input.detach(), num_samples, replacement,
                             generator or default_generator)


def maximum(input: Tensor, other: Tensor) -> Tensor:
    return _ops.maximum(input, other, True)


def minimum(input: Tensor, other: Tensor) -> Tensor:
    return _ops.maximum(input, other, False)


def clamp(input: Tensor, min=None, max=None) -> Tensor:  # noqa: A002
    return _ops.clamp(input, min, max)


def sum(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001
    return _ops.sum(input, dim, keepdim)


def mean(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return _ops.mean(input, dim, keepdim)


def amax(input: Tensor, dim=(), keepdim: bool = False) -> Tensor:
    return _ops.amax(input, dim, keepdim, True)


def amin(input: Tensor, dim=(), keepdim: bool = False) -> Tensor:
    return _ops.amax(input, dim, keepdim, False)


def argmax(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return input.argmax(dim, keepdim)


def argmin(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return input.argmin(dim, keepdim)


def softmax(input: Tensor, dim: int) -> Tensor:
    return _ops.softmax(input, dim)


def log_softmax(input: Tensor, dim: int) -> Tensor:
    return _idx.log_softmax(input, dim)


def logsumexp(input: Tensor, dim, keepdim: bool = False) -> Tensor:
    return _idx.logsumexp(input, dim, keepdim)


def exp(input: Tensor) -> Tensor:
    return input.exp()


def log(input: Tensor) -> Tensor:
    return input.log()


def sqrt(input: Tensor) -> Tensor:
    return input.sqrt()


def tril(input: Tensor, diagonal: int = 0) -> Tensor:
    return _ops.triangle(input, diagonal, False)


def triu(input: Tensor, diagonal: int = 0) -> Tensor:
    return _ops.triangle(input, diagonal, True)


def allclose(a: Tensor, b: Tensor, rtol: float = 1e-5, atol: float = 1e-8) -> bool:
    import numpy as np
    return bool(np.allclose(a.detach().double().cpu().numpy(), b.detach().double().cpu().numpy(),
                            rtol=rtol, atol=atol))
