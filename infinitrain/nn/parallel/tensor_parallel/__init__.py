"""Tensor parallelism and sequence parallelism, as Megatron-LM lays them out.

A TP group of ranks splits each layer's weights: a ColumnParallelLinear holds a block of the
output features, a RowParallelLinear a block of the input features, a VocabParallelEmbedding a
block of the vocabulary rows. Between those layers activations are either replicated on every
TP rank or, under sequence parallelism (SP), split along the sequence (dim 1 of [B, T, C]),
which divides the memory of norms, residuals and dropout by TP.

The package, by concern: shard.py (the TP group, how parameters are cut, which gradients are
partial), mappings.py (the differentiable collectives, "X in forward, Y in backward"),
layers.py (column/row-parallel linear layers, the vocabulary-parallel embedding),
cross_entropy.py (the vocabulary-parallel loss), transformer.py (nn.MultiheadAttention and the
encoder-decoder layers made tensor-parallel from their one-process form).
"""
from .cross_entropy import vocab_parallel_cross_entropy
from .layers import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, column_linear,
                     row_linear)
from .mappings import (copy_to_tp, gather_from_sp, gather_from_tp, reduce_from_tp, reduce_scatter_to_sp,
                       scatter_to_sp, scatter_to_tp)
from .shard import (TensorParallel, TPShard, full_tensor, load_full, mark_sequence_parallel,
                    mark_sequence_parallel_param, sequence_split, shard_param)
from .transformer import ParallelMultiheadAttention, parallelize_transformer

__all__ = ["TensorParallel", "TPShard", "full_tensor", "load_full", "mark_sequence_parallel",
           "mark_sequence_parallel_param", "sequence_split", "shard_param", "copy_to_tp", "reduce_from_tp",
           "scatter_to_tp", "gather_from_tp", "gather_from_sp",
           "reduce_scatter_to_sp", "scatter_to_sp", "ColumnParallelLinear", "RowParallelLinear",
           "VocabParallelEmbedding", "column_linear", "row_linear", "vocab_parallel_cross_entropy",
           "ParallelMultiheadAttention", "parallelize_transformer"]
