"""Where each rank's chunks sit in the sequence: gathered pieces (rank order) to sequence order
and back, for the chunk split of split.ContextParallel."""
from __future__ import annotations

from ....ops.shape import cat
from ....tensor import Tensor


def narrow(x: Tensor, dim: int, start: int, n: int) -> Tensor:
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, start + n)
    return x[tuple(index)]


def to_sequence_order(pieces: Tensor, cp, dim: int) -> Tensor:
    """pieces: every rank's part concatenated along dim in rank order -> sequence order."""
    c = pieces.shape[dim] // cp.n_chunks
    where = {}  # chunk -> its offset in `pieces`
    for r in range(cp.size):
        for j, chunk in enumerate(cp.chunks(r)):
            where[chunk] = (r * len(cp.chunks(r)) + j) * c
    return cat([narrow(pieces, dim, where[i], c) for i in range(cp.n_chunks)], dim)


def to_rank_order(whole: Tensor, cp, dim: int) -> Tensor:
    """The inverse of to_sequence_order: sequence order -> every rank's part, in rank order."""
    c = whole.shape[dim] // cp.n_chunks
    return cat([narrow(whole, dim, i * c, c) for r in range(cp.size) for i in cp.chunks(r)], dim)
