"""PyTorch's re-basing of views written in place. A view made by a recorded view op remembers
the tensor it views (._base). A recorded in-place write into the view gives the base a new
grad_fn, CopySlices (the view's part of the gradient goes to the written value, the rest to the
base's old value), and makes the view a view of that (ViewOf). Other views of the same base made
before the write are brought up to date when next used (refresh, from Function.apply).

The view's geometry is its shape and strides into the base's storage, so the base must be
contiguous (inplace.py refuses a write into a view of a strided base)."""
from __future__ import annotations

from ..kernels.memory import copy_into
from ..tensor import Tensor, _empty
from . import function as _function
from .function import Function


def _region(t: Tensor, base: Tensor, g: Tensor) -> Tensor:
    """The elements of g (a gradient of base's shape) that the view t of base covers."""
    g = g._contiguous_raw()
    return g._view(t.shape, t.stride(), g.storage_offset() + t.storage_offset() - base.storage_offset())


class CopySlices(Function):
    """base after a write into its view: the view's part of the gradient goes to the written
    value, the rest to base's old value (the view's geometry is kept as strides into base)."""

    @staticmethod
    def forward(ctx, base, value, view):
        ctx.view = view
        return base  # already holds the written value

    @staticmethod
    def backward(ctx, g):
        base, view = ctx.view
        gb = gv = None
        if ctx.needs_input_grad[0]:
            gb = g._clone_raw()
            copy_into(_region(view, base, gb), 0)
        if ctx.needs_input_grad[1]:
            gv = _region(view, base, g)._clone_raw()
        return gb, gv, None


class ViewOf(Function):
    """The view again, now of its re-based base (its gradient lands in its part of base's)."""

    @staticmethod
    def forward(ctx, base, view):
        ctx.view = view
        return view[1]._view(view[1].shape, view[1].stride())

    @staticmethod
    def backward(ctx, g):
        base, view = ctx.view
        out = _empty(base.shape, g.dtype, g.device)
        copy_into(out, 0)
        copy_into(_region(view, base, out), g)
        return out, None


def rebase(view: Tensor) -> None:
    """After a recorded write into `view`: its base takes a CopySlices node (the old base and the
    view's new value as inputs) and the view becomes a view of that, as PyTorch re-bases views.
    The geometry is kept as detached tensors (no reference cycles through grad_fn)."""
    base = view._base
    view.grad_fn.ctx.view_version = view._storage.version  # the write's own node is up to date
    geometry = (base.detach(), view.detach())
    new_base = CopySlices.apply(base, view, geometry)
    base.grad_fn, base._output_nr, base.requires_grad = new_base.grad_fn, 0, True
    _view_of(view, base, geometry)


def _view_of(view: Tensor, base: Tensor, geometry) -> None:
    new_view = ViewOf.apply(base, geometry)
    view.grad_fn, view._output_nr = new_view.grad_fn, 0
    view.grad_fn.ctx.view_version = view._storage.version


def refresh(view: Tensor) -> None:
    """A view whose memory was written since its grad_fn was made (through another view, which
    re-based the base) is made a view of its base's present grad_fn again before it is used."""
    _view_of(view, view._base, (view._base.detach(), view.detach()))


_function.refresh_view = refresh
