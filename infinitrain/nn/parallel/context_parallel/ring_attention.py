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

import math

from .... import amp
from .... import creation
from ....autograd import Function
from ....dtypes import float32
from ....ops.shape import stack
from .blocks import attend, attend_backward

KV, DKV = 0, 1  # link tags: the K/V ring, the dK/dV ring


def open_ring(cp) -> None:
    """Readies the ring's links (each rank to the next), once per group (NCCL: a communicator
    per directed link; MPI: nothing)."""
    if not getattr(cp.group, "_cp_ring_open", False):
        P = cp.size
        cp.group.open_p2p_links([(i, (i + 1) % P, tag) for i in range(P) for tag in (KV, DKV)])
        cp.group._cp_ring_open = True


def _pass_on(cp, t, tag: int):
    """Sends t to the next rank and receives the previous rank's into a new buffer:
    (received buffer, [works])."""
    nxt, prev = (cp.rank + 1) % cp.size, (cp.rank - 1) % cp.size
    buf = creation.empty(*t.shape, dtype=t.dtype, device=t.device)
    return buf, [cp.group.irecv(buf, prev, tag), cp.group.isend(t, nxt, tag)]


def _wait(works) -> None:
    for w in works:
        w.wait()


class _RingAttention(Function):
    @staticmethod
    def forward(ctx, q, k, v, cp, scale):
        open_ring(cp)
        B, H, T, D = q.shape
        c = T // len(cp.chunks())
        out = creation.zeros(B, H, T, D, dtype=float32, device=q.device)
        lse = creation.full((B, H, T), float("-inf"), dtype=float32, device=q.device)
        kv = stack([k, v]).contiguous()
        for step in range(cp.size):
            owner = (cp.rank - step) % cp.size
            if step + 1 < cp.size:
                incoming, works = _pass_on(cp, kv, KV)
            attend(q, kv[0], kv[1], cp.chunks(), cp.chunks(owner), c, out, lse, scale)
            if step + 1 < cp.size:
                _wait(works)
                kv = incoming
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
        acc, acc_works = None, []  # the dK/dV accumulator received from the previous rank
        for step in range(cp.size):
            owner = (cp.rank - step) % cp.size
            if step + 1 < cp.size:
                incoming, works = _pass_on(cp, kv, KV)
            dkv = creation.zeros(2, *k.shape, dtype=float32, device=k.device)
            attend_backward(g, q, kv[0], kv[1], out, lse, cp.chunks(), cp.chunks(owner), c, dq,
                            dkv[0], dkv[1], scale)
            if step > 0:
                _wait(acc_works)
                dkv.add_(acc)
            acc, acc_works = _pass_on(cp, dkv, DKV)  # on to the next rank; home after CP steps
            if step + 1 < cp.size:
                _wait(works)
                kv = incoming
        _wait(acc_works)
        return dq.to(q.dtype), acc[0].to(k.dtype), acc[1].to(v.dtype), None, None


def ring_attention(q, k, v, cp, scale: float | None = None):
    """Causal attention of this rank's queries over the whole sequence, K/V around the ring."""
    q, k, v = amp.lower(q, k, v)
    return _RingAttention.apply(q, k, v, cp, 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
