"""All-gather attention (Megatron's `cp_comm_type=all_gather`): K/V all-gathered over the CP
group in forward, dK/dV reduce-scattered back in backward. One collective each way instead of
CP-1 ring steps; holds the whole sequence's K/V for the layer's duration, so it suits small
CP groups (and GQA, whose K/V are small)."""
from __future__ import annotations

from .... import creation
from ....autograd import Function
from ....dtypes import float32
from ....ops.shape import stack
from ..process_group import ReduceOp
from .blocks import attend, attend_backward, running_result
from .order import to_rank_order, to_sequence_order


def _gather_kv(k, v, cp):
    """The whole sequence's K and V, [2, B, H_kv, T, D] in sequence order."""
    kv = stack([k, v]).contiguous()
    pieces = creation.empty(cp.size, *kv.shape, dtype=kv.dtype, device=kv.device)
    cp.group.all_gather(pieces, kv)
    pieces = pieces.permute(1, 2, 3, 0, 4, 5).reshape(2, kv.shape[1], kv.shape[2], -1, kv.shape[4])
    return to_sequence_order(pieces, cp, 3).contiguous()


class AllGatherAttention(Function):
    """apply(q, k, v, cp, scale), q, k, v this rank's chunks (ContextParallel.attention)."""

    @staticmethod
    def forward(ctx, q, k, v, cp, scale):
        c = q.shape[2] // len(cp.chunks())
        whole = _gather_kv(k, v, cp)
        out, lse = running_result(q)
        attend(q, whole[0], whole[1], cp.chunks(), range(cp.n_chunks), c, out, lse, scale)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)  # K/V gathered again in backward
        ctx.cp, ctx.scale = cp, scale
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, lse = ctx.saved_tensors
        cp, scale = ctx.cp, ctx.scale
        c = q.shape[2] // len(cp.chunks())
        whole = _gather_kv(k, v, cp)
        dq = creation.zeros(*q.shape, dtype=float32, device=q.device)
        dwhole = creation.zeros(*whole.shape, dtype=float32, device=q.device)
        attend_backward(g.contiguous(), q, whole[0], whole[1], out, lse, cp.chunks(), range(cp.n_chunks),
                        c, dq, dwhole[0], dwhole[1], scale)
        # rank order along the sequence, then rank-major: rank r's block is its own dK/dV
        ranked = to_rank_order(dwhole, cp, 3)
        Tl = k.shape[2]
        blocks = ranked.reshape(2, k.shape[0], k.shape[1], cp.size, Tl, k.shape[3]) \
            .permute(3, 0, 1, 2, 4, 5).contiguous()
        mine = creation.empty(2, *k.shape, dtype=float32, device=q.device)
        cp.group.reduce_scatter(mine, blocks, ReduceOp.SUM)
        return dq.to(q.dtype), mine[0].to(k.dtype), mine[1].to(v.dtype), None, None

