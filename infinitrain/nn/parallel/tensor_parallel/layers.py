"""The tensor-parallel layers (Megatron's layers.py): linear layers split by output features
(column) or input features (row), and an embedding split by vocabulary rows."""
from __future__ import annotations

from .... import amp, creation
from ....autograd import no_grad
from ....ops.layers import add_bias
from ... import functional as F
from ... import init
from ...module import Module
from ...modules import Linear
from ...parameter import Parameter
from .async_linear import linear_with_async_comm
from .mappings import (copy_to_tp, gather_from_sp, gather_from_tp, reduce_from_tp, reduce_scatter_to_sp,
                       scatter_to_tp)
from .shard import TensorParallel, TPShard, load_full, mark_sequence_parallel_param, shard_param


def _sharded_from(cls, whole: Module, tp: TensorParallel, *args, **kwargs):
    """cls(*args, tp, **kwargs) holding this rank's part of `whole`'s parameters (a layer one
    process built and drew): built without drawing, then loaded by name."""
    with init.deferred():
        layer = cls(*args, tp, **kwargs)
    with no_grad():
        for name, p in layer.named_parameters(recurse=False):
            load_full(p, getattr(whole, name).detach().to(device=p.device))
    return layer


# ---- layers ------------------------------------------------------------------------------

class ColumnParallelLinear(Module):
    """y = x Wᵀ + b with W's output features split over TP: each rank computes its block of y.
    `blocks` splits a fused output (q|k|v) block by block so that each rank holds whole heads
    of each. Under SP the input arrives split along the sequence and is all-gathered first."""

    def __init__(self, in_features: int, out_features: int, tp: TensorParallel, bias: bool = True,
                 gather_output: bool = False, input_is_parallel: bool = False, blocks=None,
                 pad: bool = False, dtype=None):
        """pad=True: out_features need not divide by TP; the layer holds ceil(out/TP) rows per
        rank, the padding zero (a vocabulary head whose padded columns the loss masks)."""
        super().__init__()
        blocks = tuple(blocks) if blocks is not None else (out_features,)
        if sum(blocks) != out_features:
            raise ValueError(f"blocks {blocks} do not add up to out_features {out_features}")
        if gather_output and len(blocks) > 1:
            raise ValueError("gather_output would interleave the blocks of a fused output "
                             "(q0 k0 v0 q1 k1 v1); split the blocks before gathering")
        if pad and len(blocks) == 1:
            local = -(-out_features // tp.size)
            shard = TPShard(tp.group, 0, (local * tp.size,), full_size=out_features)
        else:
            for b in blocks:
                tp.check_divisible("a column-parallel linear layer's output features", b)
            local = out_features // tp.size
            shard = TPShard(tp.group, 0, blocks)
        self.tp, self.in_features, self.out_features = tp, in_features, out_features
        self.gather_output, self.input_is_parallel = gather_output, input_is_parallel
        self.weight = shard_param((local, in_features), shard, dtype)
        self.bias = shard_param((local,), shard, dtype) if bias else None
        init.kaiming_uniform_linear_(self.weight)
        if self.bias is not None:
            init.uniform_(self.bias, -(in_features ** -0.5), in_features ** -0.5)

    @classmethod
    def from_linear(cls, linear: Linear, tp: TensorParallel, blocks=None, pad: bool = False,
                    **kwargs) -> "ColumnParallelLinear":
        """This rank's rows of a whole Linear's weight and bias (the same layer as one process)."""
        return _sharded_from(cls, linear, tp, linear.in_features, linear.out_features,
                             bias=linear.bias is not None, blocks=blocks, pad=pad, dtype=linear.weight.dtype,
                             **kwargs)

    lora_on = False  # nn.lora: lora_A whole, lora_B split as the weight's rows

    def forward(self, x):
        group, sp = self.tp.group, self.tp.sequence_parallel
        if self.tp.async_comm and (sp or not self.input_is_parallel) and not self.lora_on \
                and group.size > 1:  # backward's collectives beside its products
            y = linear_with_async_comm(x, self.weight, self.bias, group, sp)
            return gather_from_tp(y, group) if self.gather_output else y
        if sp:
            x = gather_from_sp(x, group)
        elif not self.input_is_parallel:
            x = copy_to_tp(x, group)
        y = F.linear(x, self.weight, self.bias)
        if self.lora_on:
            y = y + F.lora(x, self.lora_A, self.lora_B, self.lora_scale)
        return gather_from_tp(y, group) if self.gather_output else y

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"({self.out_features // self.tp.size} per rank), bias={self.bias is not None}")


class RowParallelLinear(Module):
    """y = x Wᵀ + b with W's input features split over TP: each rank multiplies its block of x
    and the partial products are summed (all-reduced, or reduce-scattered along the sequence
    under SP). The bias is whole on every rank and added once, after the sum."""

    def __init__(self, in_features: int, out_features: int, tp: TensorParallel, bias: bool = True,
                 input_is_parallel: bool = True, dtype=None):
        super().__init__()
        if tp.sequence_parallel and not input_is_parallel:
            raise ValueError("RowParallelLinear under sequence parallelism needs input_is_parallel=True")
        local = tp.check_divisible("a row-parallel linear layer's input features", in_features)
        self.tp, self.in_features, self.out_features = tp, in_features, out_features
        self.input_is_parallel = input_is_parallel
        self.weight = shard_param((out_features, local), TPShard(tp.group, 1, (in_features,)), dtype)
        self.bias = Parameter(creation.empty(out_features, dtype=dtype)) if bias else None
        init.kaiming_uniform_linear_(self.weight)
        if self.bias is not None:
            init.uniform_(self.bias, -(in_features ** -0.5), in_features ** -0.5)
            mark_sequence_parallel_param(self.bias, tp)

    @classmethod
    def from_linear(cls, linear: Linear, tp: TensorParallel, **kwargs) -> "RowParallelLinear":
        """This rank's columns of a whole Linear's weight, and its whole bias."""
        return _sharded_from(cls, linear, tp, linear.in_features, linear.out_features,
                             bias=linear.bias is not None, dtype=linear.weight.dtype, **kwargs)

    lora_on = False  # nn.lora: lora_A split as the weight's columns, lora_B whole

    def forward(self, x):
        group = self.tp.group
        if not self.input_is_parallel:
            x = scatter_to_tp(x, group)
        low = amp.autocast_dtype()
        if low is None:
            y = F.linear(x, self.weight)
            if self.lora_on:  # the adapter's partial product joins the layer's before the sum
                y = y + F.lora(x, self.lora_A, self.lora_B, self.lora_scale)
            y = reduce_scatter_to_sp(y, group) if self.tp.sequence_parallel else reduce_from_tp(y, group)
            return add_bias(y, self.bias) if self.bias is not None else y
        # Under autocast one process rounds x W^T + b to 16 bits once, after float32
        # accumulation. Rounding each rank's partial product before the sum would add a
        # rounding per rank, so the partial products of the rounded inputs are summed in float32
        # and rounded once, bias included (gradients are rounded where one process rounds them).
        with amp.dtype_set(None):
            xl = x.to(low).float()
            y = F.linear(xl, self.weight.to(low).float())
            if self.lora_on:
                y = y + F.lora(xl, self.lora_A.to(low).float(), self.lora_B.to(low).float(), self.lora_scale)
            y = reduce_scatter_to_sp(y, group) if self.tp.sequence_parallel else reduce_from_tp(y, group)
            if self.bias is not None:
                y = add_bias(y, self.bias.to(low).float())
            return y.to(low)

    def extra_repr(self):
        return (f"in_features={self.in_features} ({self.in_features // self.tp.size} per rank), "
                f"out_features={self.out_features}, bias={self.bias is not None}")



class VocabParallelEmbedding(Module):
    """An embedding whose rows (the vocabulary) are split over TP: each rank looks up the ids in
    its range, zeros the others, and the partial rows are summed (all-reduced, or
    reduce-scattered along the sequence under SP). A vocabulary that TP does not divide is
    padded with zero rows that no id reaches. padding_idx: the row that gets no gradient, as
    nn.Embedding's (on the rank that holds it)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, tp: TensorParallel, padding_idx=None,
                 dtype=None):
        super().__init__()
        self.tp, self.num_embeddings, self.embedding_dim = tp, num_embeddings, embedding_dim
        local = -(-num_embeddings // tp.size)
        self.vocab_start = tp.rank * local
        self.vocab_end = min(num_embeddings, self.vocab_start + local)
        if padding_idx is not None and not -num_embeddings <= padding_idx < num_embeddings:
            raise ValueError(f"VocabParallelEmbedding: padding_idx {padding_idx} is not a row of {num_embeddings}")
        self.padding_idx = None if padding_idx is None else padding_idx % num_embeddings
        mine = self.padding_idx is not None and self.vocab_start <= self.padding_idx < self.vocab_end
        self._local_padding_idx = self.padding_idx - self.vocab_start if mine else None
        self.weight = shard_param((local, embedding_dim),
                                   TPShard(tp.group, 0, (local * tp.size,), full_size=num_embeddings),
                                   dtype)
        init.normal_(self.weight)

    @classmethod
    def from_embedding(cls, embedding, tp: TensorParallel) -> "VocabParallelEmbedding":
        """This rank's rows of a whole nn.Embedding (padding_idx kept)."""
        return _sharded_from(cls, embedding, tp, embedding.num_embeddings, embedding.embedding_dim,
                             padding_idx=embedding.padding_idx, dtype=embedding.weight.dtype)

    def forward(self, ids):
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        y = F.embedding(local, self.weight, self._local_padding_idx).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.tp.sequence_parallel:
            return reduce_scatter_to_sp(y, self.tp.group)
        return reduce_from_tp(y, self.tp.group)

    def extra_repr(self):
        return (f"{self.num_embeddings}, {self.embedding_dim} (rows {self.vocab_start}.."
                f"{self.vocab_end - 1} on this rank)")


def column_linear(in_features: int, out_features: int, tp: TensorParallel | None, bias: bool = True,
                  blocks=None):
    """A Linear in one process, its column-parallel form under TP (how the models build)."""
    if tp is None:
        return Linear(in_features, out_features, bias=bias)
    return ColumnParallelLinear(in_features, out_features, tp, bias=bias, blocks=blocks)


def row_linear(in_features: int, out_features: int, tp: TensorParallel | None, bias: bool = True):
    if tp is None:
        return Linear(in_features, out_features, bias=bias)
    return RowParallelLinear(in_features, out_features, tp, bias=bias)
