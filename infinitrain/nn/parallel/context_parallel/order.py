"""Where each rank's chunks sit in the sequence: gathered pieces (rank order) to sequence order
and back, for the chunk split of split.ContextParallel — or, for a subgroup of the CP ranks
(the all-to-all of a2a+p2p), to the ascending order of the chunks its members hold."""
from __future__ import annotations

from ....ops.shape import cat
from ....tensor import Tensor


def narrow(x: Tensor, dim: int, start: int, n: int) -> Tensor:
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, start + n)
    return x[tuple(index)]


def to_chunk_order(pieces: Tensor, member_chunks, dim: int) -> Tensor:
    """pieces: each member's chunks (ascending) concatenated along dim in member order -> every
    chunk in ascending order."""
    c = pieces.shape[dim] // sum(len(chunks) for chunks in member_chunks)
    where = {chunk: k * c for k, chunk in enumerate(ch for chunks in member_chunks for ch in chunks)}
    return cat([narrow(pieces, dim, where[i], c) for i in sorted(where)], dim)


def from_chunk_order(whole: Tensor, member_chunks, dim: int) -> Tensor:
    """The inverse of to_chunk_order: ascending chunks -> each member's, in member order."""
    ascending = sorted(ch for chunks in member_chunks for ch in chunks)
    c = whole.shape[dim] // len(ascending)
    at = {chunk: k * c for k, chunk in enumerate(ascending)}
    return cat([narrow(whole, dim, at[i], c) for chunks in member_chunks for i in chunks], dim)


def to_sequence_order(pieces: Tensor, cp, dim: int) -> Tensor:
    """pieces: every rank's part concatenated along dim in rank order -> sequence order."""
    return to_chunk_order(pieces, [cp.chunks(r) for r in range(cp.size)], dim)


def to_rank_order(whole: Tensor, cp, dim: int) -> Tensor:
    """The inverse of to_sequence_order: sequence order -> every rank's part, in rank order."""
    return from_chunk_order(whole, [cp.chunks(r) for r in range(cp.size)], dim)
