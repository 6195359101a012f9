"""Tensor methods that write into the tensor: the check every in-place write makes
(`_check_inplace`), copy_, fill_, zero_, masked_fill_, the in-place operators (+=, -=, *=, /=)
and add_, sub_, mul_, div_, clamp_, the random draws (uniform_, normal_), exp_, sqrt_.
(x[key] = v is with indexing, in views.py.)"""
from __future__ import annotations

import builtins
from ..autograd.grad_mode import is_grad_enabled
from ..kernels import memory
from ..ops import index as _idx
from ..ops import math as _ops
from ..tensor import Tensor


class InplaceMethods:
    def _check_inplace(self, what: str) -> None:
        if self.requires_grad and is_grad_enabled():
            raise RuntimeError(f"{what} on a tensor that requires grad would bypass autograd; "
                               "do it under infinitrain.no_grad() or on .detach()")
        if any(s == 0 and n > 1 for n, s in zip(self._shape, self._strides)):
            raise RuntimeError(f"{what}: more than one element of the written-to tensor refers "
                               "to a single memory location (an expanded view); call .clone() "
                               "first")

    def copy_(self, src, non_blocking: builtins.bool = False) -> Tensor:
        """Copies src into this tensor (broadcasting src, converting its dtype). non_blocking, as
        PyTorch's: a copy between pinned host memory and a GPU of the same dtype and layout is
        queued on the current stream and returns at once (the host side must not be read or
        changed until the stream has passed it); any other copy is made as without it."""
        self._check_inplace("copy_()")
        memory.copy_into(self, src, non_blocking)
        return self

    def fill_(self, value) -> Tensor:
        self._check_inplace("fill_()")
        memory.copy_into(self, value)
        return self

    def zero_(self) -> Tensor:
        return self.fill_(0)

    def masked_fill_(self, mask: Tensor, value) -> Tensor:
        self._check_inplace("masked_fill_()")
        memory.copy_into(self, _idx.masked_fill(self.detach(), mask, value))
        return self

    def __iadd__(self, other):
        return self.add_(other)

    def __isub__(self, other):
        return self.sub_(other)

    def __imul__(self, other):
        return self.mul_(other)

    def __itruediv__(self, other):
        return self.div_(other)

    def _inplace(self, result: Tensor, what: str):
        """self = result (computed out of place, then written back in self's dtype)."""
        self._check_inplace(what)
        memory.copy_into(self, result)
        return self

    def add_(self, other, alpha: float = 1.0):
        return self._inplace(_ops.add(self.detach(), other if alpha == 1.0 else other * alpha), "add_()")

    def sub_(self, other):
        return self._inplace(_ops.sub(self.detach(), other), "sub_()")

    def mul_(self, other):
        return self._inplace(_ops.mul(self.detach(), other), "mul_()")

    def div_(self, other):
        if not self.dtype.is_floating_point:
            raise TypeError(f"div_() of a {self.dtype.name} tensor would need a float result")
        return self._inplace(_ops.div(self.detach(), other), "div_()")

    def clamp_(self, min=None, max=None):  # noqa: A002
        return self._inplace(_ops.clamp(self.detach(), min, max), "clamp_()")

    # in-place draws and maths, as PyTorch's (no autograd through them: a leaf that requires
    # grad is refused, as for every in-place write)
    def _draw_(self, what: str, fill):
        self._check_inplace(f"{what}()")
        target = self if self.is_contiguous() else self._clone_raw()
        fill(target)
        return self if target is self else self.copy_(target)

    def uniform_(self, a: float = 0.0, b: float = 1.0, generator=None):
        from ..random import default_generator
        return self._draw_("uniform_", lambda t: (generator or default_generator).fill_uniform(t, a, b))

    def normal_(self, mean: float = 0.0, std: float = 1.0, generator=None):
        from ..random import default_generator
        return self._draw_("normal_", lambda t: (generator or default_generator).fill_normal(t, mean, std))

    def exp_(self):
        return self.copy_(self.exp())

    def sqrt_(self):
        return self.copy_(self.sqrt())
