"""ZeRO (stages 1, 2 and 3): the optimizer's state, with stage 2 also the gradients, with stage
3 also the parameters, sharded over the data-parallel group, as DeepSpeed describes them. It
replaces DDP: gradients are averaged over DP by the reduce-scatter that shards them.

Layout. The parameters (in reverse registration order, roughly the order backward produces
their gradients) are packed into flat buckets, each padded to a multiple of DP; rank r owns
piece r of every bucket. The parameters become views into the buckets, so that one all-gather
per bucket after the step refreshes them all. Rank r's optimizer sees one 1-D "shard
parameter" per (bucket piece ∩ parameter) segment, a view into the same memory, in the group
of the parameter it is part of (so weight-decay masks come from the original parameters, not
from the flat shard).

Gradients. Stage 1 keeps full flat gradients: each .grad is a view into its bucket, so
backward accumulates in place (micro-batches too), and step() reduce-scatters every bucket in
place: this rank's shard is its own piece of the bucket (no second copy; after the step the
.grad views show the reduced piece here and what the reduction left elsewhere, until
zero_grad). Stage 2 keeps only the shards: a post-accumulate-grad hook moves each
gradient into its bucket (allocated when the bucket's first gradient lands) and drops .grad;
the bucket is reduce-scattered as soon as its last gradient has landed (overlapped with the
rest of backward), this rank's piece added into its shard and the full-size bucket freed;
with gradient accumulation every micro-batch is reduced so (DeepSpeed's way). Stage 2's buckets
hold at most a sixteenth of the model (and bucket_cap_mb), so what is in flight stays a small
part of what it holds whatever the model's size. A parameter several modules hold (a tied
embedding) has a bucket of its own and gets its gradient use by use (shared.py): stage 1 adds
each use's into the flat gradient, stages 2 and 3 reduce-scatter each as it is made (the head's
during backward, the embedding's at its end), so it is never held whole through backward nor
summed into a third copy.

Stage 3 reduces gradients as stage 2 does, with one bucket per unit of the model (stage3.py):
this rank's pieces are the only persistent copy of the parameters, gathered around each unit's
forward and backward, so the step updates the pieces and gathers nothing. With offload_param
(ZeRO-Infinity's), the pieces too live where the optimizer state is offloaded (stage3.OffloadPieces):
a unit's piece is read just ahead of its gather and dropped once gathered, and the step updates
the pieces there, so no parameter stays in memory between uses.

The package, by what each module owns: optimizer.py the ZeroOptimizer class (its constructor
in named steps, step, zero_grad, gathered_parameters); grads.py the gradient path of stages 1
to 3 (the post-accumulate-grad hook, the reduce-scatters, finish_grad_sync, tied_grad_shards,
the norm and clipping); shared.py the use-by-use gradients of a parameter several modules
hold; state.py the state dicts (one process's optimizer state gathered from and scattered to
the shards); stage3.py stage 3's parameter side (partition, Gatherer, OffloadPieces).
"""
from .optimizer import ZeroOptimizer

__all__ = ["ZeroOptimizer"]
