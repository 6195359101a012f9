"""The backward pass: walks the recorded graph from the roots in reverse topological order
(Kahn's algorithm on the number of consumers of each node), sums the gradients that reach
each node, calls its backward, frees what it saved, and accumulates into leaves.

Leaf gradients are accumulated in place into an existing .grad (so that .grad can be a view
into a communication bucket), and post-accumulate-grad hooks run right after: DDP launches a
bucket's all-reduce from them while the rest of the backward pass goes on.
"""
from __future__ import annotations

import sys
import threading
import weakref
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


def _accumulate_leaf(leaf, grad, fresh) -> None:
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
        fresh[id(grad)] = grad  # (weakly: held, it would outlive a hook that frees it, as ZeRO's do;
        # by id alone, a freed gradient's id reused by a new one would make a needless copy)
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


def _sum_into(a: Tensor, b: Tensor) -> Tensor:
    """a + b, written into a itself where nothing else can see a (the caller's reference the
    only one, and a the sole owner of its whole memory: PyTorch's InputBuffer decides by use
    count too). A leaf reached twice (GPT-2's tied embedding: the head's product and the
    lookup) then costs no third gradient-sized tensor (49 MB at GPT-2 small, 147 MB at 124M)."""
    if (a is not b and a.dtype is b.dtype and a.shape == b.shape and a._base is None and a._offset == 0
            and a.is_contiguous() and a._storage.nbytes == a.numel() * a.dtype.itemsize
            and sys.getrefcount(a) <= 3 and sys.getrefcount(a._storage) <= 2):  # (the caller's, a, the call's)
        ew.binary(lib.IT_ADD, a, b, out=a)
        return a
    return _add(a, b)


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
    nested = getattr(_local, "callbacks", None) is not None
    deferring = getattr(_local, "deferring", None)
    # grad() returns what it computes: only backward() passes defer
    walk = _Walk(retain_graph, capture, accumulate, defer=deferring is not None and not nested and not capture)
    if nested:
        # a pass inside a pass (recomputation): its callbacks run when the outer pass ends
        return walk.run(tensors, grad_tensors)
    _local.callbacks = []
    try:
        captured = walk.run(tensors, grad_tensors)
        _run_callbacks()
    finally:
        _local.callbacks = None
    if walk.deferred:
        walk.owner = deferring
        deferring.walks.append(walk)
        _local.queue.append(walk)
    return captured


def _run_callbacks() -> None:
    callbacks, _local.callbacks = _local.callbacks, None
    for fn in callbacks:
        fn()


class defer_weight_grads:
    """Within it, a backward pass computes only the gradients that flow to its inputs (B) and
    leaves the weight gradients (W: a Linear's gᵀx, a norm's or an embedding's) for later,
    keeping what they need, as torch.distributed.pipelining's stage_backward_input /
    stage_backward_weight: a pipeline stage sends the input gradient on at once and fills its
    idle time with W. A Function opts in by naming its weight arguments (`weight_inputs`);
    its backward is then called twice, with needs_input_grad masked to the inputs and then
    to the weights (or its `backward_weight`). Parameters' .grad, their hooks and DDP/ZeRO's
    bucket counts see nothing until backward_weight() (or run_deferred_weight_grads()): the
    gradients are then the same bits as a plain backward's.

        with defer_weight_grads() as deferred:
            loss.backward()
        ...                 # x.grad is ready; the weights' gradients are not
        deferred.backward_weight()
    """

    def __init__(self):
        self.walks = []

    def __enter__(self):
        self._outer = getattr(_local, "deferring", None)
        if getattr(_local, "queue", None) is None:
            _local.queue = []
        _local.deferring = self
        return self

    def __exit__(self, *exc) -> None:
        _local.deferring = self._outer

    def backward_weight(self) -> None:
        """Runs the weight gradients the backward passes within this block left, in order
        (torch.distributed.pipelining's stage_backward_weight)."""
        walks, self.walks = self.walks, []
        for walk in walks:
            _local.queue.remove(walk)
        _run_weight_walks(walks)


def run_deferred_weight_grads() -> None:
    """Runs every weight gradient left on this thread by backward passes under
    defer_weight_grads(), oldest first."""
    walks, _local.queue = getattr(_local, "queue", None) or [], []
    for walk in walks:
        walk.owner.walks.remove(walk)
    _run_weight_walks(walks)


def _run_weight_walks(walks) -> None:
    if getattr(_local, "callbacks", None) is not None:
        raise RuntimeError("deferred weight gradients cannot run inside a backward pass")
    _local.callbacks = []
    try:
        for walk in walks:
            walk.run_weights()
        _run_callbacks()
    finally:
        _local.callbacks = None


def split_grad(outputs, inputs, weights, grad_outputs):
    """A nested backward pass (inside an outer one) that returns the inputs' gradients now and
    a function that runs the deferred weight gradients and returns the weights' (recomputation
    under defer_weight_grads: the replayed piece's W runs with the outer pass's W)."""
    walk = _Walk(False, list(inputs) + list(weights), True, defer=True)
    walk.run(outputs, grad_outputs)

    def finish() -> list:
        walk.run_weights()
        return [walk.captured[id(w)] for w in weights]
    return [walk.captured[id(t)] for t in inputs], finish


class _Walk:
    """One backward pass over a graph: Kahn's algorithm on the number of consumers of each
    node. `captured`: {id(t): gradient or None} for the tensors in `capture`, whose gradients
    are kept instead of accumulated (a non-leaf's: the sum that reaches its node's output).
    accumulate: whether the other leaves get theirs. defer: the weight arguments' gradients of
    the Functions that name them are left in `deferred`, and the walk goes on from them in
    run_weights() (the same Kahn state: a leaf gets its sum, hooks included, once its last
    contribution arrives)."""

    def __init__(self, retain_graph: bool, capture, accumulate: bool, defer: bool):
        self.retain_graph, self.accumulate, self.defer = retain_graph, accumulate, defer
        self.captured, self.captured_nodes = {id(t): None for t in capture}, {}
        self.fresh = weakref.WeakValueDictionary()
        for t in capture:
            if t.grad_fn is not None:
                self.captured_nodes.setdefault(t.grad_fn, []).append((t._output_nr, id(t)))
        self.pending, self.leaf_sums, self.deferred = {}, {}, []
        self.ready = deque()

    def to_leaf(self, leaf, g) -> None:
        captured = self.captured
        if id(leaf) in captured:
            if captured[id(leaf)] is not None:
                captured[id(leaf)] = _add(captured[id(leaf)], g)
                return
            if id(g) in self.fresh:  # one gradient object reached several leaves: each gets its own
                g = g._clone_raw()
            self.fresh[id(g)] = g
            captured[id(leaf)] = g
        elif self.accumulate:
            _accumulate_leaf(leaf, g, self.fresh)

    def leaf_grad(self, leaf, g) -> None:
        key = id(leaf)
        if g is not None:
            prev = self.leaf_sums.pop(key, None)
            if prev is not None:
                before, prev = prev[1], None  # (the tuple's reference dropped: _sum_into counts them)
                g = _sum_into(before, g)
            self.leaf_sums[key] = (leaf, g)
        self.leaf_deps[key] -= 1
        if self.leaf_deps[key] == 0 and key in self.leaf_sums:
            self.to_leaf(*self.leaf_sums.pop(key))

    def run(self, tensors, grad_tensors) -> dict:
        tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
        if grad_tensors is None:
            grad_tensors = [None] * len(tensors)
        elif isinstance(grad_tensors, Tensor):
            grad_tensors = [grad_tensors]
        pending = self.pending
        with no_grad():
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
                    self.to_leaf(t, g)
                    continue
                slots = pending.setdefault(t.grad_fn, [None] * t.grad_fn.num_outputs)
                slots[t._output_nr] = g if slots[t._output_nr] is None else _add(slots[t._output_nr], g)
                roots.append(t.grad_fn)
            self.deps, self.leaf_deps = _dependencies(roots)
            self.ready.extend(n for n in dict.fromkeys(roots) if self.deps.get(n, 0) == 0)
            self._drain()
        return self.captured

    def _drain(self) -> None:
        ready, pending, retain_graph = self.ready, self.pending, self.retain_graph
        while ready:
            node = ready.popleft()
            grads = pending.pop(node)
            if node.hooks:
                for nr, hooks in node.hooks.items():
                    for hook in hooks:
                        out = hook(grads[nr])
                        if out is not None:
                            grads[nr] = out
            for nr, key in self.captured_nodes.get(node, ()):
                self.captured[key] = grads[nr]
            if node.ctx._released:
                node.ctx.saved_tensors  # raises: this graph was already walked
            grads = [g if g is not None else _zeros_for(node, i) for i, g in enumerate(grads)]
            node.ctx.retain_graph = retain_graph
            later = self._weights_to_defer(node) if self.defer else ()
            if later:
                in_grads = self._call(node, grads, later, input_part=True)
                self.deferred.append((node, grads, later))
            else:
                in_grads = self._call(node, grads)
                if not retain_graph:
                    node.ctx.release()
            if len(in_grads) < len(node.edges):
                raise RuntimeError(f"{node.name()} returned {len(in_grads)} gradients for "
                                   f"{len(node.edges)} inputs")
            for nr, (edge, g) in enumerate(zip(node.edges, in_grads)):
                if nr not in later:
                    self._send(edge, g)

    def _send(self, edge, g) -> None:
        if edge is not None and edge[0] is None:
            self.leaf_grad(edge[1], g)
            return
        if edge is None or g is None:
            if edge is not None:
                _release_dependency(edge[0], self.deps, self.ready, self.pending, self.leaf_grad)
            return
        child, where = edge
        slots = self.pending.setdefault(child, [None] * child.num_outputs)
        slots[where] = g if slots[where] is None else _add(slots[where], g)
        _release_dependency(child, self.deps, self.ready, self.pending, self.leaf_grad)

    @staticmethod
    def _call(node, grads, weights=(), input_part=False) -> tuple:
        """node's backward; with `weights`, only its input part (input_part) or only the
        weights' part (needs_input_grad masked so)."""
        ctx, fn = node.ctx, node.function
        if weights:
            needs = ctx.needs_input_grad
            ctx.needs_input_grad = tuple(n and ((i in weights) != input_part) for i, n in enumerate(needs))
        profiling = _trace.active
        if profiling is not None:
            t0 = _trace.now()
        try:
            if weights and not input_part and hasattr(fn, "backward_weight"):
                in_grads = fn.backward_weight(ctx, *grads)
            else:
                in_grads = fn.backward(ctx, *grads)
        finally:
            if weights:
                ctx.needs_input_grad = needs
        if profiling is not None:
            profiling.add(node.name(), "backward", t0)
        if _trace.inspector is not None:
            _trace.inspector.op(node.name(), "backward", in_grads if isinstance(in_grads, tuple) else (in_grads,))
        return in_grads if isinstance(in_grads, tuple) else (in_grads,)

    def _weights_to_defer(self, node) -> tuple:
        """The argument positions of node whose gradients wait for W: those its Function names
        as weights that lead to a leaf alone (directly, or through casts used only here: a
        weight under autocast). An activation in a weight's place is never deferred."""
        positions = getattr(node.ctx, "weight_inputs", None) or node.function.weight_inputs
        if not positions:
            return ()
        out = []
        for i in positions:
            edge = node.edges[i] if i < len(node.edges) else None
            if edge is not None and node.ctx.needs_input_grad[i] and self._only_casts_to_leaf(edge[0]):
                out.append(i)
        return tuple(out)

    def _only_casts_to_leaf(self, child) -> bool:
        while child is not None:
            if not (getattr(child.function, "is_cast", False) and self.deps.get(child) == 1
                    and child.edges[0] is not None):
                return False
            child = child.edges[0][0]
        return True

    def run_weights(self) -> None:
        """The deferred weight gradients, in the order their nodes' input parts ran, each sent
        on into the graph as the plain pass would have."""
        deferred, self.deferred = self.deferred, []
        with no_grad():
            for node, grads, weights in deferred:
                in_grads = self._call(node, grads, weights)
                if not self.retain_graph:
                    node.ctx.release()
                for nr in weights:
                    self._send(node.edges[nr], in_grads[nr] if nr < len(in_grads) else None)
                self._drain()


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
