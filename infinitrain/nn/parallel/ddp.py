"""DistributedDataParallel: replicas on the data-parallel ranks, gradients averaged.

The Reducer packs gradients into flat buckets (the first ~1 MB so that communication starts
early, then ~25 MB), filled in reverse registration order, roughly the order backward produces
gradients in. Each parameter's .grad is a view into its bucket, so the autograd engine
accumulates straight into the buffer that is communicated (no copy). When the last gradient of
a bucket lands (post-accumulate-grad hook) the bucket's all-reduce starts while backward goes
on; buckets are launched strictly in order so that every rank issues the same collectives in
the same sequence. At the end of backward the Reducer launches whatever is left (a parameter
that got no gradient contributes zeros, so unused parameters cannot hang the job) and waits.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

from ...autograd import no_grad
from ...autograd.engine import queue_callback
from ...creation import zeros
from ..module import Module
from .global_env import get_env
from .process_group import ReduceOp


def mark_ready(ready: set, p) -> None:
    """Counts p's gradient as final for this backward pass; a second one for the same pass
    (two separate accumulations: a nested backward, such as a hand-made recomputation) would
    arrive after its bucket may already have been reduced, so it is an error, not silent
    garbage."""
    if id(p) in ready:
        raise RuntimeError(f"a parameter of shape {tuple(p.shape)} got its gradient twice in one backward "
                           f"pass (two separate accumulations, e.g. a nested backward inside a custom "
                           f"Function): its bucket may already be reduced. Let the outer pass accumulate it "
                           f"once (return it from the Function, as infinitrain.autograd.checkpoint does)")
    ready.add(id(p))


class _Bucket:
    def __init__(self, dtype):
        self.dtype = dtype
        self.params, self.offsets, self.numel = [], [], 0
        self.flat = None

    def add(self, p) -> None:
        self.params.append(p)
        self.offsets.append(self.numel)
        self.numel += p.numel()

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


class Reducer:
    def __init__(self, params, group, bucket_cap_mb: float = 25.0, first_bucket_mb: float = 1.0):
        self.group = group
        seen, ordered = set(), []
        for p in params:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                ordered.append(p)
        self.buckets, self.where = [], {}
        current = {}
        for p in reversed(ordered):
            b = current.get(p.dtype.name)
            cap = (first_bucket_mb if b is not None and b is self.buckets[0] else bucket_cap_mb) * 2**20
            if b is None or b.nbytes + p.nbytes > cap:
                b = _Bucket(p.dtype)
                self.buckets.append(b)
                current[p.dtype.name] = b
            self.where[id(p)] = (len(self.buckets) - 1, len(b.params))
            b.add(p)
        for b in self.buckets:
            b.flat = zeros(b.numel, dtype=b.dtype, device=b.params[0].device)
            for p in b.params:
                p.register_post_accumulate_grad_hook(self._on_grad)
        self.sync = True
        self.last_wait_s = 0.0
        self._reset_round()

    def _view(self, p):
        bi, j = self.where[id(p)]
        b = self.buckets[bi]
        off = b.offsets[j]
        return b.flat[off:off + p.numel()].view(*p.shape)

    @no_grad()
    def prepare(self, sync: bool) -> None:
        """Before a forward pass: every .grad is its bucket view again (a grad set to None by
        zero_grad starts from zero; one assigned by the user is copied in)."""
        self.sync = sync
        for b in self.buckets:
            for p in b.params:
                g = p.grad
                if g is None or g._storage is not b.flat._storage:
                    view = self._view(p)
                    view.copy_(g) if g is not None else view.zero_()
                    p.grad = view
        self._reset_round()

    def _reset_round(self) -> None:
        self.pending = [len(b.params) for b in self.buckets]
        self.works = [None] * len(self.buckets)
        self.next_bucket = 0
        self.callback_queued = False
        self.ready = set()

    def _on_grad(self, p) -> None:
        if not self.sync:
            return
        if not self.callback_queued:
            queue_callback(self.finalize)
            self.callback_queued = True
        bi, _ = self.where[id(p)]
        if p.grad._storage is not self.buckets[bi].flat._storage:  # grad replaced behind our back
            self._view(p).copy_(p.grad)
            p.grad = self._view(p)
        mark_ready(self.ready, p)
        self.pending[bi] -= 1
        while self.next_bucket < len(self.buckets) and self.pending[self.next_bucket] <= 0:
            self._launch(self.next_bucket)
        for w in self.works[:self.next_bucket]:  # MPI moves non-blocking calls only when asked
            w.is_completed()

    def _launch(self, i: int) -> None:
        self.works[i] = self.group.all_reduce(self.buckets[i].flat, ReduceOp.AVG, async_op=True)
        self.next_bucket = i + 1

    def finalize(self) -> None:
        while self.next_bucket < len(self.buckets):
            self._launch(self.next_bucket)
        t0 = time.perf_counter()
        for w in self.works:
            w.wait()
        self.last_wait_s = time.perf_counter() - t0  # communication not hidden behind backward


class DistributedDataParallel(Module):
    def __init__(self, module: Module, process_group=None, bucket_cap_mb: float = 25.0,
                 first_bucket_mb: float = 1.0, broadcast_from: int = 0):
        super().__init__()
        self.module = module
        self.process_group = process_group if process_group is not None else get_env().dp_group
        with no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                if t.is_contiguous():
                    self.process_group.broadcast(t, broadcast_from)
                else:
                    tmp = t.contiguous()
                    self.process_group.broadcast(tmp, broadcast_from)
                    t.copy_(tmp)
        self.reducer = Reducer(module.parameters(), self.process_group, bucket_cap_mb, first_bucket_mb)
        self._sync = True

    def forward(self, *args, **kwargs):
        self.reducer.prepare(self._sync)
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self):
        """Gradients accumulate locally (gradient accumulation); the next synchronised
        backward averages the sum."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous
