"""Function: a differentiable operation with forward(ctx, ...) and backward(ctx, *grads).

Function.apply runs forward without recording, then, if grad mode is on and an input needs a
gradient, links the outputs to a Node that remembers the context and where each input's
gradient goes: to the node that produced the input, or to the input itself if it is a leaf.
"""
from __future__ import annotations

from .. import _trace
from ..tensor import Tensor
from .grad_mode import is_grad_enabled, no_grad


class Context:
    """What forward leaves for backward. Saved tensors are released as soon as backward has
    used them, so a graph can be walked once (as in PyTorch without retain_graph)."""

    def __init__(self, needs_input_grad: tuple):
        self.needs_input_grad = needs_input_grad
        # True while a backward pass runs that keeps the graph (retain_graph=True): backward
        # must then leave its saved tensors intact (no reuse of their memory)
        self.retain_graph = False
        self._saved = ()
        self._versions = ()
        self._released = False

    def save_for_backward(self, *tensors) -> None:
        self._saved = tensors
        # the version of each one's storage now: an in-place write before backward reads them
        # makes backward raise instead of computing with the changed values
        self._versions = [t._storage.version if isinstance(t, Tensor) else None for t in tensors]

    @property
    def saved_tensors(self) -> tuple:
        if self._released:
            raise RuntimeError("trying to run backward through the graph a second time (its "
                               "saved tensors were freed after the first); call "
                               "backward(retain_graph=True) the first time if you need that")
        for t, version in zip(self._saved, self._versions):
            if version is not None and t._storage.version != version:
                _modified(t, version)
        return self._saved

    def release(self) -> None:
        self._saved = ()
        self._versions = ()
        self._released = True
        for name in [k for k in vars(self) if k not in ("needs_input_grad", "_saved", "_released",
                                                        "retain_graph", "_versions")]:
            delattr(self, name)  # anything else forward stashed (tensors kept as attributes)


def _modified(t, version: int) -> None:
    made_by = f", which is output {t._output_nr} of {t.grad_fn.name()}," if t.grad_fn is not None else ""
    raise RuntimeError(f"one of the variables needed for gradient computation has been modified by an "
                       f"inplace operation: [{t.dtype.name} {list(t.shape)}]{made_by} is at version "
                       f"{t._storage.version}; expected version {version} instead. Hint: find the in-place "
                       f"write (x += ..., x.add_(...), relu_(), x[key] = ...) to this tensor, a view of it or "
                       f"its .detach() between the forward pass and backward, and make it out of place")


class Node:
    """One recorded application of a Function."""

    __slots__ = ("function", "ctx", "edges", "num_outputs", "hooks", "__weakref__")

    def __init__(self, function, ctx: Context, edges: list, num_outputs: int):
        self.function = function
        self.ctx = ctx
        self.edges = edges            # per input: (Node, output_nr), (None, leaf tensor) or None
        self.num_outputs = num_outputs
        self.hooks = None             # {output_nr: [fn]} from register_hook on non-leaf outputs

    def name(self) -> str:
        return self.function.__name__ + "Backward"

    def __repr__(self) -> str:
        return f"<{self.name()}>"


# views.refresh, set by views.py (which builds on this module): brings a view whose memory was
# written through another view up to date before it is used
refresh_view = None


def _edge(t):
    if t._base is not None and getattr(t.grad_fn.ctx, "view_version", None) != t._storage.version:
        refresh_view(t)
    if t.grad_fn is not None:
        return (t.grad_fn, t._output_nr)
    return (None, t)  # a leaf that requires grad


class Function:
    # True for the view ops (reshape, permute, expand, indexing): an output that shares its
    # input's memory remembers the tensor it views, as ._base
    makes_view = False
    # the positions of the arguments that are weights (Linear's weight and bias): under
    # autograd.defer_weight_grads their gradients wait for W (engine.py); () for none
    weight_inputs = ()

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError

    @classmethod
    def apply(cls, *args, **kwargs):
        needs = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        record = any(needs) and is_grad_enabled()
        ctx = Context(needs)
        profiling = _trace.active
        if profiling is not None:
            t0 = _trace.now()
        with no_grad():
            out = cls.forward(ctx, *args, **kwargs)
        if profiling is not None:
            profiling.add(cls.__name__, "op", t0)
        if _trace.inspector is not None:
            _trace.inspector.op(cls.__name__, "forward", out if isinstance(out, tuple) else (out,))
        if not record:
            return out
        outputs = out if isinstance(out, tuple) else (out,)
        edges = [_edge(a) if need else None for a, need in zip(args, needs)]
        node = Node(cls, ctx, edges, len(outputs))
        if len(outputs) > 1:  # to make zeros for outputs that get no gradient
            ctx.output_meta = [(o.shape, o.dtype, o.device) for o in outputs]
        for i, o in enumerate(outputs):
            if isinstance(o, Tensor) and o.dtype.is_floating_point:
                if o.grad_fn is not None or o.requires_grad or any(o is a for a in args):
                    o = o.detach()  # forward returned an input or a recorded tensor: re-wrap
                    outputs = outputs[:i] + (o,) + outputs[i + 1:]
                o.requires_grad = True
                o.grad_fn = node
                o._output_nr = i
        if cls.makes_view and outputs[0]._storage is args[0]._storage:
            # an in-place write into the view must re-base the tensor it views (inplace.py)
            outputs[0]._base = args[0] if args[0]._base is None else args[0]._base
            ctx.view_version = outputs[0]._storage.version
        return outputs if isinstance(out, tuple) else outputs[0]
