"""Where a rank sits in the pipeline: its stage, and the model chunks it holds.

The model's L transformer blocks are cut into P x V contiguous chunks (P stages, V virtual
chunks per stage). In the "loop" placement chunk g runs on stage g mod P as that stage's local
chunk g // P, so with V > 1 a stage holds every P-th chunk (Megatron's interleaving). In the
"v" placement (ZBV, V = 2) stage s holds chunks s and 2P-1-s: the activations go down the
stages and back up, and stage 0 holds both ends. The embedding lives in global chunk 0 (local
chunk 0 of stage 0), the final norm, head and loss in the last global chunk (local chunk V-1
of stage P-1 in a loop, of stage 0 in a V).

How many blocks each chunk gets: split="even" gives every chunk L / (P V) blocks, the first
L mod (P V) one more (Megatron's default). split="balanced" (the default) counts the head as
the blocks' worth of work it is (GPT-2's 50k x 768 output product is 5.5 blocks of the 124M
model) and gives the last chunk fewer blocks, so that the busiest stage, which sets the pace
of the whole pipeline, does as little as it can (Megatron has to be told, with
--decoder-last-pipeline-num-layers; InfiniTrain's PRs #221/#223 set the split by hand).
"""
from __future__ import annotations


PLACEMENTS = ("loop", "v")


def stage_of(g: int, stages: int, placement: str = "loop") -> int:
    """The stage that runs global chunk g."""
    return g % stages if placement == "loop" else (g if g < stages else 2 * stages - 1 - g)


def global_chunk(stage: int, local: int, stages: int, placement: str = "loop") -> int:
    """The global chunk that is `stage`'s local chunk `local`."""
    return local * stages + stage if placement == "loop" or local == 0 else 2 * stages - 1 - stage


def chunk_layers(n_layer: int, stages: int, virtual: int = 1, head: float = 0.0, placement: str = "loop") -> list:
    """The block indices of every global chunk: [[0, 1], [2, 3], ...], P x V lists. head: the
    work of the final norm, head and loss in blocks' worth; with head > 0 the last chunk gets
    the number of blocks k that makes the busiest stage's work smallest (the others share the
    rest evenly); 0 splits evenly. placement: which stage holds which chunk (see above)."""
    chunks = stages * virtual
    if n_layer < chunks:
        raise ValueError(f"{n_layer} layers cannot fill pipeline parallel {stages} x virtual "
                         f"{virtual} = {chunks} chunks of at least one layer each")
    if head <= 0 or chunks == 1:
        return _contiguous(_even(n_layer, chunks))

    def busiest(counts):
        work = [0.0] * stages
        for g, n in enumerate(counts):
            work[stage_of(g, stages, placement)] += n
        work[stage_of(chunks - 1, stages, placement)] += head
        return max(work)
    options = [_even(n_layer - k, chunks - 1) + [k] for k in range(1, n_layer - chunks + 2)]
    # the least work on the busiest stage; of equals, the most blocks on the last chunk
    return _contiguous(min(reversed(options), key=busiest))


def _even(n_layer: int, chunks: int) -> list:
    base, extra = divmod(n_layer, chunks)
    return [base + (1 if g < extra else 0) for g in range(chunks)]


def _contiguous(counts: list) -> list:
    out, at = [], 0
    for n in counts:
        out.append(list(range(at, at + n)))
        at += n
    return out


class PipelineStage:
    """This rank's place in a pipeline over `group` (its ranks in stage order, one per stage).
    `embedding_group`: the first and last stage's ranks of this (dp, tp) position, over which
    a tied input/output embedding's gradient is summed (None unless P > 1; unused in a V,
    where stage 0 holds both ends). split: "balanced" (the head counted as the blocks' worth
    of work it is) or "even" (see chunk_layers). placement: "loop" or "v" (two chunks)."""

    def __init__(self, group, virtual: int = 1, embedding_group=None, split: str = "balanced",
                 placement: str = "loop"):
        if not isinstance(virtual, int) or virtual < 1:
            raise ValueError(f"virtual pipeline parallel must be a positive integer, got {virtual!r}")
        if split not in ("balanced", "even"):
            raise ValueError(f"pipeline split must be 'balanced' or 'even', got {split!r}")
        if placement not in PLACEMENTS:
            raise ValueError(f"pipeline placement must be 'loop' or 'v', got {placement!r}")
        if placement == "v" and virtual != 2:
            raise ValueError(f"the V placement holds two chunks per stage, got virtual pipeline parallel {virtual}")
        self.group, self.virtual, self.split, self.placement = group, virtual, split, placement
        self.embedding_group = embedding_group if placement == "loop" else None
        self.size, self.stage = group.size, group.rank

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        """Whether this stage holds the last chunk (the head)."""
        return self.stage == self.last_stage

    @property
    def last_stage(self) -> int:
        return stage_of(self.size * self.virtual - 1, self.size, self.placement)

    def global_chunk(self, local: int) -> int:
        return global_chunk(self.stage, local, self.size, self.placement)

    def stage_of(self, g: int) -> int:
        return stage_of(g, self.size, self.placement)

    def layers(self, n_layer: int, head: float = 0.0) -> list:
        """The block indices of each of this stage's V local chunks (head: the head's work in
        blocks' worth, which a balanced split counts)."""
        every = chunk_layers(n_layer, self.size, self.virtual, head if self.split == "balanced" else 0.0,
                             self.placement)
        return [every[self.global_chunk(v)] for v in range(self.virtual)]

    def __repr__(self) -> str:
        v = ", V placement" if self.placement == "v" else ""
        return f"PipelineStage(stage {self.stage} of {self.size}, virtual {self.virtual}{v})"
