"""The backward pass: walks the recorded graph from the roots in reverse topological order
(Kahn's algorithm on the number of consumers of each node), sums the gradients that reach
each node, calls its backward, frees what it saved, and accumulates into leaves.

Leaf gradients are accumulated in place into an existing .grad (so that .grad can be a view
into a communication bucket), and post-accumulate-grad hooks run right after: DDP launches a
bucket's all-reduce from them while the rest of the backward pass goes on.
"""
from __future__ import annotations

import threading
from collections import deque

from .. import _trace
from .._native import lib
from ..kernels import elementwise as ew
from ..kernels.memory import convert, copy_into
from ..tensor import Tensor, _empty
from .grad_mode import no_grad

_local = threading.local()


def queue_callback(fn) -> None:
    """Runs fn() once the backward pass in progress has finished (DDP waits for its gradient
    all-reduces there)."""
    callbacks = getattr(_local, "callbacks", None)
    if callbacks is None:
        raise RuntimeError("queue_callback() can only be called during a backward pass")
    callbacks.append(fn)


def in_backward() -> bool:
    """True while a backward pass runs on this thread (a recomputed piece's forward replay
    runs inside one)."""
    return getattr(_local, "callbacks", None) is not None


def _dependencies(roots) -> tuple:
    """For every node reachable from the roots, and every leaf: how many edges point into it.
    A leaf reached by several edges (a weight used twice, such as a tied embedding) gets its
    contributions summed and accumulated once, as PyTorch's AccumulateGrad does, so that its
    post-accumulate-grad hooks see the final gradient."""
    deps, leaf_deps, seen, stack = {}, {}, set(), [n for n in roots]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for edge in node.edges:
            if edge is None:
                continue
            child, where = edge
            if child is None:
                leaf_deps[id(where)] = leaf_deps.get(id(where), 0) + 1
            else:
                deps[child] = deps.get(child, 0) + 1
                stack.append(child)
    return deps, leaf_deps


def _accumulate_leaf(leaf, grad, fresh: set) -> None:
    for hook in getattr(leaf, "_hooks", None) or ():
        out = hook(grad)
        if out is not None:
            grad = out
    if leaf.grad is None:
        # One gradient object can reach several leaves (a + b passes its grad to both): the
        # second gets a copy, so that later in-place accumulation never writes into another.
        if id(grad) in fresh or not grad.is_contiguous() or grad.dtype is not leaf.dtype \
                or grad.shape != leaf.shape:
            grad = convert(grad._expand_raw(leaf.shape), leaf.dtype)
        fresh.add(id(grad))
        leaf.grad = grad
    else:
        accumulate(leaf.grad, grad)
    for hook in getattr(leaf, "_post_acc_hooks", None) or ():
        hook(leaf)


def accumulate(dst: Tensor, g: Tensor) -> None:
    """dst += g in place (dst may be a view into a communication bucket)."""
    if g.dtype is not dst.dtype:
        g = convert(g, dst.dtype)
    if dst.is_contiguous() and g.shape == dst.shape:
        ew.binary(lib.IT_ADD, dst, g, out=dst)
    else:
        copy_into(dst, ew.binary(lib.IT_ADD, dst, g))


def _add(a: Tensor, b: Tensor) -> Tensor:
    """Two gradient contributions summed (in the wider dtype if they differ)."""
    if a.dtype is not b.dtype:
        from ..dtypes import promote_types
        dt = promote_types(a.dtype, b.dtype)
        a, b = convert(a, dt), convert(b, dt)
    return ew.binary(lib.IT_ADD, a, b)


def zero_grads(parameters, set_to_none: bool = True) -> None:
    """Clears gradients (Module.zero_grad and Optimizer.zero_grad)."""
    for p in parameters:
        if p.grad is not None:
            if set_to_none:
                p.grad = None
            else:
                copy_into(p.grad, 0)


def backward(tensors, grad_tensors=None, retain_graph: bool = False) -> None:
    _run_pass(tensors, grad_tensors, retain_graph, (), True)


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool = False, allow_unused: bool = False,
         accumulate_others: bool = False) -> tuple:
    """The gradients of outputs with respect to inputs (torch.autograd.grad), returned, not
    accumulated into .grad; the inputs' hooks do not run. Leaves that are not among the inputs
    are left alone, unless accumulate_others (a recomputed piece's replay: parameters that reach
    it other than as inputs still get their gradients)."""
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    for i, t in enumerate(inputs):
        if not isinstance(t, Tensor) or not t.requires_grad:
            raise RuntimeError(f"grad(): input {i} does not require grad")
    capture = _run_pass(outputs, grad_outputs, retain_graph, inputs, accumulate_others)
    out = []
    for i, t in enumerate(inputs):
        g = capture[id(t)]
        if g is None and not allow_unused:
            raise RuntimeError(f"grad(): input {i} was not used to compute the outputs; pass "
                               f"allow_unused=True if that is expected")
        out.append(g)
    return tuple(out)


def _run_pass(tensors, grad_tensors, retain_graph, capture, accumulate) -> dict:
    if getattr(_local, "callbacks", None) is not None:
        # a pass inside a pass (recomputation): its callbacks run when the outer pass ends
        return _backward(tensors, grad_tensors, retain_graph, capture, accumulate)
    _local.callbacks = []
    try:
        captured = _backward(tensors, grad_tensors, retain_graph, capture, accumulate)
        callbacks, _local.callbacks = _local.callbacks, None
        for fn in callbacks:
            fn()
        return captured
    finally:
        _local.callbacks = None


def _backward(tensors, grad_tensors, retain_graph: bool, capture=(), accumulate: bool = True) -> dict:
    """Returns {id(t): gradient or None} for the tensors in `capture`, whose gradients are kept
    instead of accumulated (a non-leaf's: the sum that reaches its node's output). accumulate:
    whether the other leaves get theirs."""
    captured, captured_nodes, fresh = {id(t): None for t in capture}, {}, set()
    for t in capture:
        if t.grad_fn is not None:
            captured_nodes.setdefault(t.grad_fn, []).append((t._output_nr, id(t)))

    def to_leaf(leaf, g) -> None:
        if id(leaf) in captured:
            if captured[id(leaf)] is not None:
                captured[id(leaf)] = _add(captured[id(leaf)], g)
                return
            if id(g) in fresh:  # one gradient object reached several leaves: each gets its own
                g = g._clone_raw()
            fresh.add(id(g))
            captured[id(leaf)] = g
        elif accumulate:
            _accumulate_leaf(leaf, g, fresh)

    tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    if grad_tensors is None:
        grad_tensors = [None] * len(tensors)
    elif isinstance(grad_tensors, Tensor):
        grad_tensors = [grad_tensors]
    with no_grad():
        pending = {}   # node -> list of summed grads per output
        roots = []
        for t, g in zip(tensors, grad_tensors):
            if not t.requires_grad:
                raise RuntimeError("backward(): the tensor does not require grad and has no "
                                   "grad_fn (was it computed under no_grad, or from tensors "
                                   "without requires_grad=True?)")
            if g is None:
                if t.numel() != 1:
                    raise RuntimeError(f"backward(): a gradient must be given for a non-scalar "
                                       f"output of shape {tuple(t.shape)}")
                g = _empty(t.shape, t.dtype, t.device)
                copy_into(g, 1)
            elif tuple(g.shape) != tuple(t.shape):
                raise ValueError(f"backward(): gradient of shape {tuple(g.shape)} for a tensor "
                                 f"of shape {tuple(t.shape)}")
            else:
                g = g._clone_raw()
            if t.grad_fn is None:
                to_leaf(t, g)
                continue
            slots = pending.setdefault(t.grad_fn, [None] * t.grad_fn.num_outputs)
            slots[t._output_nr] = g if slots[t._output_nr] is None else _add(slots[t._output_nr], g)
            roots.append(t.grad_fn)

        deps, leaf_deps = _dependencies(roots)
        leaf_sums = {}  # id(leaf) -> (leaf, summed gradient so far)

        def leaf_grad(leaf, g) -> None:
            key = id(leaf)
            if g is not None:
                prev = leaf_sums.get(key)
                leaf_sums[key] = (leaf, g if prev is None else _add(prev[1], g))
            leaf_deps[key] -= 1
            if leaf_deps[key] == 0 and key in leaf_sums:
                to_leaf(*leaf_sums.pop(key))

        ready = deque(n for n in dict.fromkeys(roots) if deps.get(n, 0) == 0)
        while ready:
            node = ready.popleft()
            grads = pending.pop(node)
            if node.hooks:
                for nr, hooks in node.hooks.items():
                    for hook in hooks:
                        out = hook(grads[nr])
                        if out is not None:
                            grads[nr] = out
            for nr, key in captured_nodes.get(node, ()):
                captured[key] = grads[nr]
            if node.ctx._released:
                node.ctx.saved_tensors  # raises: this graph was already walked
            grads = [g if g is not None else _zeros_for(node, i) for i, g in enumerate(grads)]
            node.ctx.retain_graph = retain_graph
            profiling = _trace.active
            if profiling is not None:
                t0 = _trace.now()
            in_grads = node.function.backward(node.ctx, *grads)
            if profiling is not None:
                profiling.add(node.name(), "backward", t0)
            if _trace.inspector is not None:
                _trace.inspector.op(node.name(), "backward",
                                    in_grads if isinstance(in_grads, tuple) else (in_grads,))
            if not isinstance(in_grads, tuple):
                in_grads = (in_grads,)
            if not retain_graph:
                node.ctx.release()
            if len(in_grads) < len(node.edges):
                raise RuntimeError(f"{node.name()} returned {len(in_grads)} gradients for "
                                   f"{len(node.edges)} inputs")
            for edge, g in zip(node.edges, in_grads):
                if edge is not None and edge[0] is None:
                    leaf_grad(edge[1], g)
                    continue
                if edge is None or g is None:
                    if edge is not None:
                        _release_dependency(edge[0], deps, ready, pending, leaf_grad)
                    continue
                child, where = edge
                slots = pending.setdefault(child, [None] * child.num_outputs)
                slots[where] = g if slots[where] is None else _add(slots[where], g)
                _release_dependency(child, deps, ready, pending, leaf_grad)
    return captured


def _release_dependency(child, deps, ready, pending, leaf_grad) -> None:
    deps[child] -= 1
    if deps[child] == 0:
        if child in pending:
            ready.append(child)
        else:  # nothing reached it: its inputs get nothing either, but count them down
            for edge in child.edges:
                if edge is None:
                    continue
                if edge[0] is None:
                    leaf_grad(edge[1], None)
                else:
                    _release_dependency(edge[0], deps, ready, pending, leaf_grad)


def _zeros_for(node, output_nr):
    shape, dtype, device = node.ctx.output_meta[output_nr]
    out = _empty(shape, dtype, device)
    copy_into(out, 0)
    return out
