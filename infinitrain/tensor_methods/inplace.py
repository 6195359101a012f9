"""Tensor methods that write into the tensor: copy_, fill_, zero_, masked_fill_, the in-place
operators (+=, -=, *=, /=) and add_, sub_, mul_, div_, clamp_, relu_, exp_, sqrt_, the random
draws (uniform_, normal_), scatter_, scatter_add_, index_add_. (x[key] = v is with indexing,
in views.py, and goes through `_write` below.)

Autograd follows them as PyTorch does. Every write bumps the version of the tensor's storage,
which tensors saved for backward are checked against (a saved tensor changed since, through
itself, a view or .detach(), makes backward raise). With grad mode on and the tensor or the
written value requiring grad, the new value is computed out of place by the recorded ops,
written into the tensor, and the tensor takes the result's place in the graph (its grad_fn).
A leaf that requires grad (or a view of one) cannot be written outside no_grad. A write
through a view of a tensor that requires grad re-bases the view's base, as PyTorch does
(autograd/views.py); only a view of a non-contiguous base is refused."""
from __future__ import annotations

import builtins
from .. import dtypes as _dt
from .._native import lib
from ..autograd.function import Function
from ..autograd.grad_mode import is_grad_enabled
from ..autograd.views import rebase
from ..kernels import memory
from ..kernels.elementwise import broadcast_shapes
from ..ops import index as _idx
from ..ops import math as _ops
from ..ops import scatter as _scatter
from ..tensor import Tensor, _empty



def _kind(dt) -> int:
    return 2 if dt.is_floating_point else 0 if dt is _dt.bool else 1


class Copy(Function):
    """The written tensor's new value: src (a tensor or a number) broadcast to its shape in its
    dtype. Nothing flows back to the old value, which is overwritten."""

    @staticmethod
    def forward(ctx, dst, src):
        ctx.src = (src.shape, src.dtype, src.device) if isinstance(src, Tensor) else None
        out = _empty(dst.shape, dst.dtype, dst.device)
        memory.copy_into(out, src)
        return out

    @staticmethod
    def backward(ctx, g):
        # the old value gets zeros, as PyTorch's (its leaves get a .grad of zeros, not None)
        gdst = _ops._zeros_like(g) if ctx.needs_input_grad[0] else None
        if ctx.src is None:
            return gdst, None
        shape, dtype, device = ctx.src
        return gdst, memory.convert(_ops.sum_to(g, shape), dtype, device)


class IndexPut(Function):
    """x with x[key] = value: the gradient of the written positions goes to value, the rest to x."""

    @staticmethod
    def forward(ctx, x, value, key):
        ctx.key = key
        ctx.value = (value.shape, value.dtype, value.device) if isinstance(value, Tensor) else None
        out = x._clone_raw()
        out[key] = value
        return out

    @staticmethod
    def backward(ctx, g):
        gx = gv = None
        if ctx.needs_input_grad[0]:
            gx = g._clone_raw()
            gx[ctx.key] = 0
        if ctx.value is not None and ctx.needs_input_grad[1]:
            shape, dtype, device = ctx.value
            gv = memory.convert(_ops.sum_to(g[ctx.key], shape), dtype, device)
        return gx, gv, None


class InplaceMethods:
    def _check_inplace(self, what: str) -> None:
        """Refuses a write no program should make (an expanded view: one element written many
        times) and, with grad mode on, a write autograd cannot follow."""
        if any(s == 0 and n > 1 for n, s in zip(self._shape, self._strides)):
            raise RuntimeError(f"{what}: more than one element of the written-to tensor refers "
                               "to a single memory location (an expanded view); call .clone() "
                               "first")
        if not (self.requires_grad and is_grad_enabled()):
            return
        if self.grad_fn is None:
            raise RuntimeError(f"{what}: a leaf Variable that requires grad is being used in an in-place "
                               "operation; do it under infinitrain.no_grad() or on .detach()")
        base = self._base
        if base is not None and base.grad_fn is None and base.requires_grad:
            raise RuntimeError(f"{what}: a view of a leaf Variable that requires grad is being used in an "
                               "in-place operation; do it under infinitrain.no_grad() or on .detach()")
        if base is not None and not base.is_contiguous():
            raise RuntimeError(f"{what}: in-place writes into a view of a strided (non-contiguous) tensor that "
                               "requires grad are not supported; write into a view of a .contiguous() copy")

    def _records(self, what: str, *values) -> builtins.bool:
        """Checks the write, and says whether autograd records it: grad mode on, and this tensor or
        a written value requires grad."""
        self._check_inplace(what)
        if not is_grad_enabled():
            return False
        if not self.requires_grad and not any(isinstance(v, Tensor) and v.requires_grad for v in values):
            return False
        if not self.requires_grad and (self._offset or self.nbytes != self._storage.nbytes):
            # a raw view of a tensor without grad: its base would not see the gradient's path
            raise RuntimeError(f"{what}: writing a value that requires grad into a view of a tensor that "
                               "does not require grad is not supported; assign into the base "
                               "(base[key] = value) or build the tensor with cat/stack")
        return True

    def _write(self, result: Tensor, recorded: builtins.bool) -> Tensor:
        """self = result, computed out of place from self's old value (recorded by autograd when
        `recorded`); self's version is bumped and, if recorded, self takes result's grad_fn."""
        if tuple(result.shape) != self._shape:
            raise RuntimeError(f"output with shape {list(self._shape)} doesn't match the broadcast "
                               f"shape {list(result.shape)}")
        if _kind(result.dtype) > _kind(self.dtype):
            raise RuntimeError(f"result type {result.dtype.name} can't be cast to the desired output "
                               f"type {self.dtype.name}")
        if not recorded or result.grad_fn is None:
            memory.copy_into(self, result)
            self._storage.version += 1
            return self
        ctx = result.grad_fn.ctx
        # what backward will read must survive the write: a saved tensor that shares self's
        # memory is copied first. The output of relu_, exp_, sqrt_ (and kin), saved as PyTorch's
        # are, is swapped for self, which holds its value (no second copy of the activation; a
        # later write into self is then refused in backward, as PyTorch does)
        swap = result.grad_fn.function is _ops.Unary and result.dtype is self.dtype
        relu = swap and ctx.op == lib.IT_RELU  # its mask reads the same from its output as its input
        saved = [t if not isinstance(t, Tensor) or (swap and t is result) or (relu and t is self)
                 or t._storage is not self._storage else t._clone_raw() for t in ctx._saved]
        if result.dtype is not self.dtype:
            result = _ops.cast(result, self.dtype)
        memory.copy_into(self, result)
        self._storage.version += 1
        if saved:
            ctx.save_for_backward(*(self if swap and t is result else t for t in saved))
        self.grad_fn, self._output_nr, self.requires_grad = result.grad_fn, result._output_nr, True
        if self._base is not None:
            rebase(self)
        return self

    def _setitem_recorded(self, key, value) -> None:
        self._write(IndexPut.apply(self, value, key), True)

    def _check_source(self, src) -> None:
        if isinstance(src, Tensor) and broadcast_shapes(self._shape, src.shape) != self._shape:
            raise RuntimeError(f"output with shape {list(self._shape)} doesn't match the broadcast "
                               f"shape {list(broadcast_shapes(self._shape, src.shape))}")

    def copy_(self, src, non_blocking: builtins.bool = False) -> Tensor:
        """Copies src into this tensor (broadcasting src, converting its dtype). non_blocking, as
        PyTorch's: a copy between pinned host memory and a GPU of the same dtype and layout is
        queued on the current stream and returns at once (the host side must not be read or
        changed until the stream has passed it); any other copy is made as without it."""
        self._check_source(src)
        if self._records("copy_()", src):
            return self._write(Copy.apply(self, src), True)
        memory.copy_into(self, src, non_blocking)
        self._storage.version += 1
        return self

    def fill_(self, value) -> Tensor:
        if isinstance(value, Tensor) and value.ndim != 0:
            raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor with "
                               f"{value.ndim} dimensions.")
        return self.copy_(value)

    def zero_(self) -> Tensor:
        return self.fill_(0)

    def masked_fill_(self, mask: Tensor, value) -> Tensor:
        recorded = self._records("masked_fill_()", value)
        return self._write(_idx.masked_fill(self if recorded else self.detach(), mask, value), recorded)

    def __iadd__(self, other):
        return self.add_(other)

    def __isub__(self, other):
        return self.sub_(other)

    def __imul__(self, other):
        return self.mul_(other)

    def __itruediv__(self, other):
        return self.div_(other)

    def _binary_(self, what: str, op, other):
        recorded = self._records(what, other)
        return self._write(op(self if recorded else self.detach(), other), recorded)

    def add_(self, other, alpha: float = 1.0):
        return self._binary_("add_()", _ops.add, other if alpha == 1.0 else other * alpha)

    def sub_(self, other, alpha: float = 1.0):
        return self._binary_("sub_()", _ops.sub, other if alpha == 1.0 else other * alpha)

    def mul_(self, other):
        return self._binary_("mul_()", _ops.mul, other)

    def div_(self, other):
        if not self.dtype.is_floating_point:
            raise TypeError(f"div_() of a {self.dtype.name} tensor would need a float result")
        return self._binary_("div_()", _ops.div, other)

    def clamp_(self, min=None, max=None):  # noqa: A002
        recorded = self._records("clamp_()")
        return self._write(_ops.clamp(self if recorded else self.detach(), min, max), recorded)

    clip_ = clamp_

    def relu_(self):
        recorded = self._records("relu_()")
        return self._write((self if recorded else self.detach()).relu(), recorded)

    def exp_(self):
        recorded = self._records("exp_()")
        return self._write((self if recorded else self.detach()).exp(), recorded)

    def sqrt_(self):
        recorded = self._records("sqrt_()")
        return self._write((self if recorded else self.detach()).sqrt(), recorded)

    # in-place draws, as PyTorch's: no gradient flows to the old value
    def _draw_(self, what: str, fill):
        recorded = self._records(f"{what}()")
        target = self if self.is_contiguous() and not recorded else _empty(self._shape, self.dtype, self.device)
        fill(target)
        if target is self:
            self._storage.version += 1
            return self
        return self._write(Copy.apply(self, target), True) if recorded else self.copy_(target)

    def uniform_(self, a: float = 0.0, b: float = 1.0, generator=None):
        from ..random import default_generator
        return self._draw_("uniform_", lambda t: (generator or default_generator).fill_uniform(t, a, b))

    def normal_(self, mean: float = 0.0, std: float = 1.0, generator=None):
        from ..random import default_generator
        return self._draw_("normal_", lambda t: (generator or default_generator).fill_normal(t, mean, std))

    # scatter and index_add, in place and out of place (infinitrain/ops/scatter.py)
    def scatter_(self, dim: int, index: Tensor, src=None, *, value=None, reduce=None):
        src = _scatter.source(src, value)
        recorded = self._records("scatter_()", src)
        return self._write(_scatter.scatter(self if recorded else self.detach(), dim, index, src,
                                            reduce=reduce), recorded)

    def scatter_add_(self, dim: int, index: Tensor, src: Tensor):
        recorded = self._records("scatter_add_()", src)
        return self._write(_scatter.scatter_add(self if recorded else self.detach(), dim, index, src), recorded)

    def index_add_(self, dim: int, index: Tensor, source: Tensor, *, alpha=1):
        recorded = self._records("index_add_()", source)
        return self._write(_scatter.index_add(self if recorded else self.detach(), dim, index, source,
                                              alpha=alpha), recorded)

    def scatter(self, dim: int, index: Tensor, src=None, *, value=None, reduce=None):
        return _scatter.scatter(self, dim, index, _scatter.source(src, value), reduce=reduce)

    def scatter_add(self, dim: int, index: Tensor, src: Tensor):
        return _scatter.scatter_add(self, dim, index, src)

    def index_add(self, dim: int, index: Tensor, source: Tensor, *, alpha=1):
        return _scatter.index_add(self, dim, index, source, alpha=alpha)
