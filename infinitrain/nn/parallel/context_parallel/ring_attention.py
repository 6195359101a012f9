"""Ring attention: K/V passed around the CP ring in forward, dK/dV passed around it back home in
backward (dQ stays local).

Forward: CP steps. At step s this rank holds the K/V of rank (r - s) mod CP; it posts the
non-blocking send of that K/V to the next rank and the receive of the previous rank's, computes
its query chunks against the K/V it holds while they travel, merges (log-sum-exp, float32),
then waits. Backward: the same ring of K/V, plus a float32 dK/dV accumulator that follows one
step behind: at step s this rank adds its block gradients for owner (r - s) to the accumulator
it received (which already holds ranks r-1 ... r-s's), and sends it on; after CP steps every
accumulator is back with its owner, holding every rank's part."""
from __future__ import annotations

from .... import creation
from ....autograd import Function
from ....dtypes import float32
from ....ops.shape import stack
from .blocks import attend, attend_backward, running_result

KV, DKV = 0, 1  # link tags: the K/V ring, the dK/dV ring


def open_ring(cp) -> None:
    """Readies the ring's links, each rank to the next, once per ContextParallel (NCCL: a
    communicator per directed link; MPI: nothing)."""
    if not cp.ring_open:
        P = cp.size
        cp.group.open_p2p_links([(i, (i + 1) % P, tag) for i in range(P) for tag in (KV, DKV)])
        cp.ring_open = True


class _PassOn:
    """Sends t to the next rank and receives the previous rank's tensor of its shape into a new
    buffer; wait() returns that buffer. Holds t until then: memory a send still reads must not
    go back to the allocator."""

    def __init__(self, cp, t, tag: int):
        nxt, prev = (cp.rank + 1) % cp.size, (cp.rank - 1) % cp.size
        self.sent, self.received = t, creation.empty(*t.shape, dtype=t.dtype, device=t.device)
        # the send first, and waited for first: a GPU stream may run only once something waits
        # on it (so the emulated GPU runs them), and a receive needs the other rank's send
        self.works = [cp.group.isend(t, nxt, tag), cp.group.irecv(self.received, prev, tag)]

    def wait(self):
        for w in self.works:
            w.wait()
        self.sent = None
        return self.received


class RingAttention(Function):
    """apply(q, k, v, cp, scale), q, k, v this rank's chunks (ContextParallel.attention)."""

    @staticmethod
    def forward(ctx, q, k, v, cp, scale):
        open_ring(cp)
        c = q.shape[2] // len(cp.chunks())
        out, lse = running_result(q)
        kv = stack([k, v]).contiguous()
        for step in range(cp.size):
            owner = (cp.rank - step) % cp.size
            if step + 1 < cp.size:
                passing = _PassOn(cp, kv, KV)
            attend(q, kv[0], kv[1], cp.chunks(), cp.chunks(owner), c, out, lse, scale)
            if step + 1 < cp.size:
                kv = passing.wait()
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cp, ctx.scale = cp, scale
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, lse = ctx.saved_tensors
        cp, scale = ctx.cp, ctx.scale
        g = g.contiguous()
        c = q.shape[2] // len(cp.chunks())
        dq = creation.zeros(*q.shape, dtype=float32, device=q.device)
        kv = stack([k, v]).contiguous()
        acc = None  # the dK/dV accumulator on its way from the previous rank
        for step in range(cp.size):
            owner = (cp.rank - step) % cp.size
            if step + 1 < cp.size:
                passing = _PassOn(cp, kv, KV)
            dkv = creation.zeros(2, *k.shape, dtype=float32, device=k.device)
            attend_backward(g, q, kv[0], kv[1], out, lse, cp.chunks(), cp.chunks(owner), c, dq,
                            dkv[0], dkv[1], scale)
            if acc is not None:
                dkv.add_(acc.wait())
            acc = _PassOn(cp, dkv, DKV)  # on to the next rank; home after CP steps
            if step + 1 < cp.size:
                kv = passing.wait()
        dkv = acc.wait()
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None

