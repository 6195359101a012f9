"""Context parallelism: the sequence of every sample split over a CP group of ranks, so that
each holds T/CP tokens of activations (picotron's fourth dimension, Megatron's `--context-
parallel-size`).

Attention is the only layer that looks across tokens; everything else (embeddings, norms,
MLPs, the head) works on this rank's tokens alone. Each rank's parameters then get the part
of the gradient its tokens produce: the DP x CP group sums them (layout.py's `dp_cp` group),
exactly as it averages data-parallel replicas.

The package, by concern, each contract "X in forward, Y in backward":

    split.py                 ContextParallel: the head-tail split of the sequence, the global
                             positions of this rank's tokens, and
      shard                  this rank's chunks of a sequence       (inputs: no gradient)
      gather                 all-gather, in sequence order          this rank's chunks
    ring_attention.py        K/V passed around the ring             dK/dV passed around it back home
    all_gather_attention.py  all-gather K/V                         reduce-scatter dK/dV
    a2a_attention.py         all-to-all to whole sequences of H/CP  the reverse all-to-all
                             heads, and back after attention
    loss.py                  all-reduce the loss over CP            the gradient times CP (the
                                                                    dp_cp mean divides by CP)
    blocks.py                the block products both attentions run, merged by log-sum-exp
    order.py                 rank order <-> sequence order of the chunks
"""
from .split import ContextParallel

__all__ = ["ContextParallel"]
