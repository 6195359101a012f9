"""Where a rank sits in the pipeline: its stage, and the model chunks it holds.

The model's L transformer blocks are cut into P x V contiguous chunks (P stages, V virtual
chunks per stage); the first L mod (P V) chunks get one block more. Chunk g runs on stage
g mod P as that stage's local chunk g // P, so with V > 1 a stage holds every P-th chunk
(Megatron's interleaving). The embedding lives in global chunk 0 (local chunk 0 of stage 0),
the final norm, head and loss in the last global chunk (local chunk V-1 of stage P-1).
"""
from __future__ import annotations


def chunk_layers(n_layer: int, stages: int, virtual: int = 1) -> list:
    """The block indices of every global chunk: [[0, 1], [2, 3], ...], P x V lists."""
    chunks = stages * virtual
    if n_layer < chunks:
        raise ValueError(f"{n_layer} layers cannot fill pipeline parallel {stages} x virtual "
                         f"{virtual} = {chunks} chunks of at least one layer each")
    base, extra = divmod(n_layer, chunks)
    out, at = [], 0
    for g in range(chunks):
        n = base + (1 if g < extra else 0)
        out.append(list(range(at, at + n)))
        at += n
    return out


class PipelineStage:
    """This rank's place in a pipeline over `group` (its ranks in stage order, one per stage).
    `embedding_group`: the first and last stage's ranks of this (dp, tp) position, over which
    a tied input/output embedding's gradient is summed (None unless P > 1)."""

    def __init__(self, group, virtual: int = 1, embedding_group=None):
        if not isinstance(virtual, int) or virtual < 1:
            raise ValueError(f"virtual pipeline parallel must be a positive integer, got {virtual!r}")
        self.group, self.virtual, self.embedding_group = group, virtual, embedding_group
        self.size, self.stage = group.size, group.rank

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.size - 1

    def global_chunk(self, local: int) -> int:
        return local * self.size + self.stage

    def layers(self, n_layer: int) -> list:
        """The block indices of each of this stage's V local chunks."""
        every = chunk_layers(n_layer, self.size, self.virtual)
        return [every[self.global_chunk(v)] for v in range(self.virtual)]

    def __repr__(self) -> str:
        return f"PipelineStage(stage {self.stage} of {self.size}, virtual {self.virtual})"
