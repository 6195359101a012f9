"""All-to-all attention (DeepSpeed-Ulysses, Megatron's `cp_comm_type=a2a`): outside attention
each rank holds T/CP tokens of every head; an all-to-all before attention gives it the whole
sequence for H/CP heads, causal attention runs there as on one process, and an all-to-all after
turns the result back. Two collectives of the activations each way, none inside attention, so it
suits groups whose interconnect favours all-to-all; the heads must split over CP.

    seq_to_heads   all-to-all [B, H, T/CP, D] -> [B, H/CP, T, D]     the reverse all-to-all
    heads_to_seq   all-to-all [B, H/CP, T, D] -> [B, H, T/CP, D]     the reverse all-to-all

Grouped-query K/V: with KV heads a multiple of CP each rank takes KV/CP of them; with fewer KV
heads than CP (CP a multiple of KV) each KV head is sent to the CP/KV ranks whose query heads
read it (replicated), and its gradient, which comes back from each of them, is summed.

The hybrid `a2a+p2p` (Megatron's hierarchical CP): the CP ranks form groups of A neighbours
(one node's, where all-to-all is cheap) and R = CP/A rings across them. The all-to-all runs
inside each group, whose ranks then hold H/A heads of the group's 2A chunks; ring attention
runs across the groups (split.Ring: each ring member's chunks are its group's), and the
all-to-all turns the result back. The head-tail chunks keep every rank's work equal.
"""
from __future__ import annotations

from .... import creation
from ....autograd import Function
from ....dtypes import float32
from .order import from_chunk_order, to_chunk_order


def head_ranges(heads: int, kv_heads: int, cp_size: int) -> tuple:
    """([query head range of rank j], [K/V head range of rank j]) for heads split over CP, or a
    ValueError naming the sizes that do not split."""
    if heads % cp_size or (kv_heads % cp_size and cp_size % kv_heads):
        raise ValueError(f"--cp_comm a2a splits the attention heads over the {cp_size} ranks of its all-to-all "
                         f"group (the CP ranks; --cp_a2a_size under a2a+p2p): this rank's {heads} query heads "
                         f"must be a multiple of {cp_size}, and its {kv_heads} key/value heads a multiple or a "
                         "divisor of it (use --cp_comm p2p or all_gather otherwise)")
    per, group = heads // cp_size, heads // kv_heads
    q = [range(j * per, (j + 1) * per) for j in range(cp_size)]
    kv = [range(j * per // group, ((j + 1) * per - 1) // group + 1) for j in range(cp_size)]
    return q, kv


def _seq_to_heads(x, cp, ranges):
    """x [B, H, T/CP, D] (this rank's chunks) -> [B, len(range), T', D], the heads of this
    rank's range over the chunks of every rank of the all-to-all group (cp: .group,
    .member_chunks; T' = their tokens, the whole sequence under plain a2a) in ascending order."""
    B, _, Tl, D = x.shape
    h = len(ranges[0])
    send = creation.empty(cp.size, B, h, Tl, D, dtype=x.dtype, device=x.device)
    for j, r in enumerate(ranges):
        send[j] = x[:, r.start:r.stop]
    recv = creation.empty(*send.shape, dtype=x.dtype, device=x.device)
    cp.group.all_to_all_single(recv, send)  # block r: rank r's tokens of my heads
    whole = recv.permute(1, 2, 0, 3, 4).reshape(B, h, cp.size * Tl, D)
    return to_chunk_order(whole, cp.member_chunks, 2).contiguous()


def _heads_to_seq(y, cp, ranges, heads: int, dtype):
    """The inverse direction: y [B, h, T, D] for this rank's head range -> [B, heads, T/CP, D]
    this rank's tokens; heads sent by several ranks (replicated K/V) are summed, in float32
    for 16-bit gradients."""
    B, h, T, D = y.shape
    Tl = T // cp.size
    send = from_chunk_order(y, cp.member_chunks, 2).reshape(B, h, cp.size, Tl, D)
    send = send.permute(2, 0, 1, 3, 4).contiguous()
    recv = creation.empty(*send.shape, dtype=y.dtype, device=y.device)
    cp.group.all_to_all_single(recv, send)  # block j: my tokens of rank j's heads
    disjoint = all(r.stop <= s.start for r, s in zip(ranges, ranges[1:]))
    if disjoint:  # every head comes from one rank: a plain reassembly
        return recv.permute(1, 0, 2, 3, 4).reshape(B, heads, Tl, D).contiguous().to(dtype)
    out = creation.zeros(B, heads, Tl, D, dtype=float32, device=y.device)
    for j, r in enumerate(ranges):
        out[:, r.start:r.stop] += recv[j].to(float32)
    return out.to(dtype)


class SequenceToHeads(Function):
    """apply(x, cp, ranges): all-to-all to whole sequences of this rank's heads in forward; the
    reverse all-to-all (summing replicated heads) in backward."""

    @staticmethod
    def forward(ctx, x, cp, ranges):
        ctx.meta = (cp, ranges, x.shape[1], x.dtype)
        return _seq_to_heads(x.contiguous(), cp, ranges)

    @staticmethod
    def backward(ctx, g):
        cp, ranges, heads, dtype = ctx.meta
        return _heads_to_seq(g.contiguous(), cp, ranges, heads, dtype), None, None


class HeadsToSequence(Function):
    """apply(y, cp, ranges, heads): all-to-all back to this rank's tokens of every head in
    forward; the forward all-to-all in backward."""

    @staticmethod
    def forward(ctx, y, cp, ranges, heads):
        ctx.meta = (cp, ranges)
        return _heads_to_seq(y.contiguous(), cp, ranges, heads, y.dtype)

    @staticmethod
    def backward(ctx, g):
        cp, ranges = ctx.meta
        return _seq_to_heads(g.contiguous(), cp, ranges), None, None, None


def a2a_attention(q, k, v, a2a, scale: float, ring=None):
    """Causal attention of this rank's queries [B, H, T/CP, D] over the whole sequence (k, v:
    this rank's [B, H_kv, T/CP, D]), the heads split over the all-to-all group `a2a` (the CP
    group, or a2a+p2p's groups of neighbours) inside; with `ring` (a2a+p2p), ring attention
    across the groups on their chunks."""
    from ... import functional as F
    from .ring_attention import RingAttention
    q_ranges, kv_ranges = head_ranges(q.shape[1], k.shape[1], a2a.size)
    qh = SequenceToHeads.apply(q, a2a, q_ranges)
    kh, vh = SequenceToHeads.apply(k, a2a, kv_ranges), SequenceToHeads.apply(v, a2a, kv_ranges)
    if ring is None:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, enable_gqa=True)
    else:
        out = RingAttention.apply(qh, kh, vh, ring, scale)
    return HeadsToSequence.apply(out, a2a, q_ranges, q.shape[1])
