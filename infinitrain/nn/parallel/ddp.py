"""DistributedDataParallel: replicas on the data-parallel ranks, gradients averaged.

The Reducer keeps the gradients in the flat buffer (param_buffer.py: the first bucket ~1 MB so
that communication starts early, then ~25 MB). Each parameter's .grad is a view into its
bucket, so the autograd engine accumulates straight into the buffer that is communicated.
When the last gradient of a bucket lands (post-accumulate-grad hook) the bucket's all-reduce
starts while backward goes on; buckets are launched strictly in order so that every rank issues the same collectives in
the same sequence. At the end of backward the Reducer launches whatever is left (a parameter
that got no gradient contributes zeros, so unused parameters cannot hang the job) and waits.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

from ...autograd import no_grad
from ...autograd.engine import queue_callback
from ..module import Module
from .param_buffer import ParamAndGradBuffer, broadcast_replicas, mark_ready, pack, trainable
from .process_group import ReduceOp, default_data_parallel_group


class Reducer:
    """All-reduces (averages) the gradients of params over group, bucket by bucket, as backward
    produces them (buckets: param_buffer.pack)."""

    def __init__(self, params, group, bucket_cap_mb: float = 25.0, first_bucket_mb: float = 1.0):
        self.group = group
        self.buffer = ParamAndGradBuffer(pack(trainable(params), bucket_cap_mb, first_bucket_mb))
        for b in self.buffer:
            b.flat_grad = b.new_flat()  # the .grad views are made before each forward (prepare)
            for p in b.params:
                p.register_post_accumulate_grad_hook(self._on_grad)
        self.sync = True
        self.last_wait_s = 0.0
        # called as on_reduced(params, work) when a bucket's all-reduce is queued: its gradients
        # are final once work is done (an OffloadOptimizer streams them to the host then)
        self.on_reduced = None
        self._reset_round()

    @property
    def buckets(self) -> list:
        return self.buffer.buckets

    def prepare(self, sync: bool) -> None:
        """Before a forward pass: every .grad is its bucket view again (a grad set to None by
        zero_grad starts from zero; one assigned by the user is copied in)."""
        self.sync = sync
        self.buffer.hold_grads()
        self._reset_round()

    def _reset_round(self) -> None:
        self.pending = [len(b.params) for b in self.buckets]
        self.works = [None] * len(self.buckets)
        self.next_bucket = 0
        self.callback_queued = False
        self.finished = False  # this round's reduction is complete (finish_grad_sync ran)
        self.ready = set()

    @no_grad()
    def _on_grad(self, p) -> None:
        if not self.sync:
            return
        if not self.callback_queued:
            queue_callback(self.finish_grad_sync)
            self.callback_queued = True
        bi, _ = self.buffer.locate(p)
        if p.grad._storage is not self.buckets[bi].flat_grad._storage:  # grad replaced behind our back
            view = self.buffer.grad_view(p)
            view.copy_(p.grad)
            p.grad = view
        mark_ready(self.ready, p)
        self.pending[bi] -= 1
        while self.next_bucket < len(self.buckets) and self.pending[self.next_bucket] <= 0:
            self._launch(self.next_bucket)
        for w in self.works[:self.next_bucket]:  # MPI moves non-blocking calls only when asked
            w.is_completed()

    def _launch(self, i: int) -> None:
        self.works[i] = self.group.all_reduce(self.buckets[i].flat_grad, ReduceOp.AVG, async_op=True)
        self.next_bucket = i + 1
        if self.on_reduced is not None:
            self.on_reduced(self.buckets[i].params, self.works[i])

    def finish_grad_sync(self) -> None:
        """The one door through which this round's reduction completes (Megatron's
        finish_grad_sync): launches the buckets backward left (a parameter that got no gradient
        contributes zeros) and waits for every all-reduce. Runs at the end of a synchronised
        backward (an autograd callback, so that .grad is averaged when backward returns, as
        with PyTorch's DDP) and again from finalize_grads, where it has nothing left to do."""
        if not self.sync or self.finished:
            return
        self.finished = True
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
        self.process_group = process_group if process_group is not None else default_data_parallel_group()
        broadcast_replicas(list(module.parameters()) + list(module.buffers()), self.process_group, broadcast_from)
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
