"""ZeRO's gradient path, stages 1 to 3 (a mixin of ZeroOptimizer): each bucket's gradient
storage (stage 1 the full flat gradient the .grad views show, stages 2 and 3 this rank's
shard), the post-accumulate-grad hook that moves a gradient into its bucket, the
reduce-scatters that average a bucket over DP into this rank's shard (stages 2 and 3 during
backward, at most one in flight; stage 1 in finish_grad_sync), finish_grad_sync (the one door
through which a step's DP reduction completes), tied_grad_shards (a pipeline's tied
parameter, summed by finalize_grads) and the global norm with clipping.

It works on what ZeroOptimizer's constructor made: stage, group, world, rank, buffer,
buckets (with their shard_param, shard_grad, flat_grad, pending), segments, gatherer and
_tied_buckets.
"""
from __future__ import annotations

from ....autograd import no_grad
from ....autograd.engine import accumulate, queue_callback
from ....creation import empty, zeros
from ...utils import scale_, total_norm
from ..finalize import reduce_partial_grads
from ..param_buffer import mark_ready
from ..process_group import ReduceOp, _then


class ZeroGrads:
    """The gradient side of ZeroOptimizer."""

    # ---- the gradient storage, made by the constructor --------------------------------------
    def _make_grad_storage(self, b, offload_param) -> None:
        """Bucket b's gradient storage, made as the bucket is packed: stage 1 the flat gradient
        whose piece is the shard, else the shard alone (offload_param: released until the
        pieces have gone to the store)."""
        if self.stage == 1:  # the shard is this rank's piece of the full gradient, reduced in place
            b.flat_grad = b.new_flat()
            b.shard_grad = b.shard(b.flat_grad, b.rank)
            for j, p in enumerate(b.params):
                p.grad = b.grad_view(j)
        else:
            b.shard_grad = zeros(b.piece, dtype=b.dtype, device=b.device)
            b.shard_zero = True  # nothing landed in it since zero_grad: a reduce-scatter may write it
            if offload_param is not None:  # made once the pieces are gone: half the peak
                b.shard_grad._storage.release("ZeRO-3's gradient shard before its memory is made")

    def _allocate_released_grad_shards(self) -> None:
        """offload_param: the gradient shards get their memory, now that the pieces are gone."""
        for b in self.buckets:
            b.shard_grad._storage.allocate(b.piece * b.shard_grad.itemsize)
            b.shard_grad.zero_()

    def _init_grad_sync(self) -> None:
        """The state of the gradients' synchronisation, before the first backward."""
        self._callback_queued = False
        self._ready = set()  # parameters whose gradient is final in this backward pass
        # stages 2 and 3: called as on_reduced(shard parameters) when a bucket's reduce-scatter
        # has landed in this rank's shard (an OffloadOptimizer streams them to the host then); a
        # tied parameter's shard is left out, as finalize_grads still sums it over the pipeline
        self.on_reduced = None
        self._shared_landed = {}  # shared buckets reduced this backward, told to on_reduced at its end
        self._shards_of = {}  # id(bucket) -> this rank's shard parameters in it
        for shard, bi, _, _, _ in self.segments:
            self._shards_of.setdefault(id(self.buckets[bi]), []).append(shard)
        for b in self._tied_buckets:
            self._shards_of.pop(id(b), None)
        self._works = []
        self._sharded = False  # this step's gradients are final: reduce-scattered (stage 1), tied summed

    # ---- gradients --------------------------------------------------------------------------
    @no_grad()
    def _on_grad(self, p) -> None:
        bi, j = self.buffer.locate(p)
        b = self.buckets[bi]
        if self.stage == 1:
            if p.grad._storage is not b.flat_grad._storage:  # .grad was reset behind our back
                view = b.grad_view(j)
                accumulate(view, p.grad)
                p.grad = view
            return
        if b.shared:  # a use that read the parameter outside its modules' forward (shared.py)
            g, p.grad = p.grad, None
            return self._on_shared_grad(p, g)
        self._queue_finish()
        mark_ready(self._ready, p)
        reduce_partial_grads([p])  # SP, LoRA: summed over TP now, before this rank's .grad is dropped
        if b.flat_grad is None and len(b.params) == 1 and b.padded == p.numel() and p.grad.is_contiguous():
            b.flat_grad = p.grad.view(-1)  # a bucket of one parameter: its gradient, no copy
        else:
            if b.flat_grad is None:
                b.flat_grad = b.new_flat()
            accumulate(b.grad_view(j), p.grad)  # (in place: add_ would make a temporary of its size)
        p.grad = None  # the flat bucket holds it now
        b.pending -= 1
        if b.pending == 0:
            self._reduce(b)
            self._collect(keep=1)  # at most one bucket in flight: memory bounded, overlap kept
            if self.gatherer is not None:
                self.gatherer.grads_done(bi)

    def _queue_finish(self) -> None:
        if not self._callback_queued:
            queue_callback(self._finish_backward)
            self._callback_queued = True

    @no_grad()
    def _on_shared_grad(self, p, g) -> None:
        """One use's gradient of a parameter several modules hold (shared.py), which has a
        bucket of its own: stage 1 adds it into the flat gradient (.grad's view); stages 2 and 3
        reduce-scatter it into the shard now, and stage 3 frees the weights that use gathered."""
        bi, j = self.buffer.locate(p)
        b = self.buckets[bi]
        if self.stage == 1:
            accumulate(b.grad_view(j), g)
            return
        self._queue_finish()
        if g.dtype is not b.dtype:
            g = g.to(b.dtype)
        if b.padded == p.numel() and g.is_contiguous():
            b.flat_grad = g.view(-1)  # its own memory, reduced and dropped: no copy
        else:
            b.flat_grad = b.new_flat()
            b.grad_view(j).copy_(g)
        del g
        self._reduce(b)
        self._collect(keep=1)
        if self.gatherer is not None:
            self.gatherer.grads_done(bi)  # this use's backward is done: the next gathers again

    def _reduce(self, b) -> None:
        """Stage 2: this bucket's reduce-scatter starts now; its full gradient is freed when
        it is done (at the end of backward). One rank (offload_param's ZeRO-3): the gradient
        is the shard's, added now."""
        if b.group.size == 1:
            b.shard_zero = False
            accumulate(b.shard_grad, b.flat_grad if b.expert_scale is None else b.flat_grad * b.expert_scale)
            b.flat_grad, b.pending = None, -1
            self._landed(b)
            return
        # the first reduction since zero_grad lands in the shard itself, later ones are added to it
        out = b.shard_grad if b.shard_zero else empty(b.piece, dtype=b.dtype, device=b.device)
        b.shard_zero = False
        # the work keeps the gradient it reads (a shared bucket's next use may replace flat_grad)
        flat, b.flat_grad = b.flat_grad, None
        self._works.append((b, out, flat, self._reduce_scatter(b, out, flat, async_op=True)))
        b.pending = -1  # launched

    def _reduce_scatter(self, b, out, flat, async_op: bool = False):
        """Bucket b's gradient averaged over DP x CP into out, this rank's piece: over its group
        (an expert bucket: summed over the ranks holding those experts, then divided by DP x
        CP, as ddp.Reducer does)."""
        if b.expert_scale is None:
            return b.group.reduce_scatter(out, flat, ReduceOp.AVG, async_op=async_op)
        work = b.group.reduce_scatter(out, flat, ReduceOp.SUM, async_op=True)
        then = _then(work, lambda: out.mul_(b.expert_scale))
        if async_op:
            return then
        then.wait()
        return None

    def _collect(self, keep: int = 0) -> None:
        """Waits for all but the newest `keep` reduce-scatters, adds them into the shards and
        frees their full-size buckets."""
        done, self._works = self._works[:len(self._works) - keep], self._works[len(self._works) - keep:]
        for b, out, _, work in done:
            work.wait()
            if out is not b.shard_grad:
                accumulate(b.shard_grad, out)
            self._landed(b)

    def _landed(self, b) -> None:
        if self.on_reduced is None:
            return
        if b.shared:  # final only after its last use's share: told once, at the end of backward
            self._shared_landed[id(b)] = b
            return
        self.on_reduced(self._shards_of.get(id(b), []))

    def _finish_backward(self) -> None:
        for b in self.buckets:  # a parameter that got no gradient contributes zeros
            if b.pending >= 0 and not b.shared:
                if b.flat_grad is None:
                    b.flat_grad = b.new_flat()
                self._reduce(b)
        self._collect()
        for b in self._shared_landed.values():  # (offload streams the tied shard once, not per use)
            self.on_reduced(self._shards_of.get(id(b), []))
        self._shared_landed = {}
        for b in self.buckets:
            b.pending = len(b.params)
        self._callback_queued = False
        self._ready = set()

    @no_grad()
    def finish_grad_sync(self) -> None:
        """The one door through which a step's DP reduction completes (finalize_grads calls it
        once per step, before the norm or the step): stage 1 reduce-scatters every bucket's full
        gradient into its shard (stages 2 and 3 did during backward, each micro-batch's at its
        backward's end)."""
        if self._sharded:
            return
        if self.stage == 1:
            for b in self.buckets:
                self._reduce_scatter(b, b.shard_grad, b.flat_grad)
        self._sharded = True

    def tied_grad_shards(self) -> list:
        """Stage 2 under a pipeline: this rank's piece of each tied parameter's gradient (the
        parameter's .grad is gone), which finalize_grads sums over the first and last stage
        like the full gradients of stage 1 (each tied parameter has a bucket of its own, so the
        two stages' pieces line up)."""
        return [b.shard_grad for b in self._tied_buckets]

    # ---- the norm ---------------------------------------------------------------------------
    @no_grad()
    def clip_grad_norm_(self, max_norm: float, pipeline_group=None) -> float:
        """One global 2-norm over every rank's gradient shard (the one-process norm: under TP,
        squares of tensor-parallel shards are also summed over TP, replicated parameters
        counted once; under PP, summed over the pipeline's stages, a stage's copy of a tied
        parameter left out); scales the shards when it exceeds max_norm. Returns the norm
        before clipping."""
        self.finish_grad_sync()
        pairs = [(p, shard.grad) for shard, _, _, p, _ in self.segments]
        total = total_norm(pairs, self.buckets[0].device, dp_group=self.group, pipeline_group=pipeline_group)
        scale_([b.shard_grad for b in self.buckets], max_norm, total)
        return total
