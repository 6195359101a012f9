"""The original Transformer's modules (nn.MultiheadAttention, nn.TransformerEncoderLayer and
DecoderLayer, nn.Transformer) made tensor-parallel from their one-process form, as Megatron
splits its attention and MLP: each TP rank keeps a block of the heads (its rows of q, k and v,
column-parallel, and the matching columns of out_proj, row-parallel) and a block of the
feed-forward's hidden units (linear1 column-, linear2 row-parallel). Two all-reduces per
attention or feed-forward block in each direction, and the same numbers as one process.

Built by taking this rank's part of the whole modules, which every rank built alike (one seed):
the sharded model starts where the one-process model starts. Dropout on split activations
(attention probabilities, hidden units) draws from the TP rank's fork of the generator."""
from __future__ import annotations

from ....autograd import no_grad
from ...module import Module
from ...transformer import MultiheadAttention, TransformerDecoderLayer, TransformerEncoderLayer
from .async_linear import linear_with_async_comm
from .layers import ColumnParallelLinear, RowParallelLinear
from .mappings import copy_to_tp, gather_from_tp, reduce_from_tp
from .shard import TensorParallel, TPShard, load_full, shard_param


class ParallelMultiheadAttention(MultiheadAttention):
    """nn.MultiheadAttention with its heads split over TP (num_heads / TP per rank). Its
    parameters keep PyTorch's names, each rank holding its block of them: in_proj_weight
    [3E/TP, E] (this rank's rows of q, then of k, then of v), or q/k/v_proj_weight [E/TP, *];
    in_proj_bias [3E/TP]; bias_k, bias_v [1, 1, E/TP]; out_proj row-parallel. Queries, keys and
    values enter whole (their gradients summed over TP in backward); the output is whole."""

    def __init__(self, *args, **kwargs):
        raise TypeError("build ParallelMultiheadAttention with ParallelMultiheadAttention.from_module(mha, tp)")

    @classmethod
    def from_module(cls, mha: MultiheadAttention, tp: TensorParallel) -> "ParallelMultiheadAttention":
        if tp.sequence_parallel:
            raise ValueError("MultiheadAttention under sequence parallelism is not implemented: "
                             "build the TensorParallel with sequence_parallel=False")
        heads = tp.check_divisible("MultiheadAttention's num_heads", mha.num_heads)
        self = cls.__new__(cls)
        Module.__init__(self)
        for k, v in vars(mha).items():  # PyTorch's attributes (sizes, flags), not the parameters
            if not k.startswith("_") or k == "_qkv_same_embed_dim":
                object.__setattr__(self, k, v)
        self.tp, self._local_heads = tp, heads
        E = mha.embed_dim
        split_rows = {"in_proj_weight": TPShard(tp.group, 0, (E, E, E)),
                      "in_proj_bias": TPShard(tp.group, 0, (E, E, E)),
                      "q_proj_weight": TPShard(tp.group, 0, (E,)), "k_proj_weight": TPShard(tp.group, 0, (E,)),
                      "v_proj_weight": TPShard(tp.group, 0, (E,)),
                      "bias_k": TPShard(tp.group, 2, (E,)), "bias_v": TPShard(tp.group, 2, (E,))}
        for name, shard in split_rows.items():
            whole = getattr(mha, name)
            if whole is None:
                setattr(self, name, None)
                continue
            shape = list(whole.shape)
            shape[shard.dim] //= tp.size
            p = shard_param(shape, shard, whole.dtype)
            with no_grad():
                load_full(p, whole.detach().cpu())
            setattr(self, name, p)
        self.out_proj = RowParallelLinear.from_linear(mha.out_proj, tp)
        self.generator = tp.generator
        self.training = mha.training
        return self

    @property
    def local_heads(self) -> int:
        return self._local_heads

    def _enter(self, x):
        return copy_to_tp(x, self.tp.group)

    def _in_linear(self, x, weight, bias):
        """A column-parallel product: backward's all-reduce of x's gradient beside the weight
        gradient's product (as ColumnParallelLinear)."""
        if self.tp.async_comm and self.tp.size > 1:
            return linear_with_async_comm(x, weight, bias, self.tp.group, False)
        return super()._in_linear(x, weight, bias)

    def _local_mask(self, bias):
        if bias.ndim == 4 and bias.shape[1] == self.num_heads:  # a mask per head: this rank's heads
            first = self.tp.rank * self._local_heads
            return bias[:, first:first + self._local_heads]
        return bias

    def _joined_weights(self, weights, average: bool):
        """[N, H/TP, L, S] per rank: averaged over every head (a sum over TP), or all heads."""
        group = self.tp.group
        if average:
            return reduce_from_tp(weights.sum(dim=1), group) * (1.0 / self.num_heads)
        return gather_from_tp(weights.permute(0, 2, 3, 1), group).permute(0, 3, 1, 2)

    def extra_repr(self):
        return super().extra_repr() + f" ({self._local_heads} heads per rank)"


def parallelize_transformer(module: Module, tp: TensorParallel) -> Module:
    """Makes every nn.TransformerEncoderLayer / DecoderLayer inside `module` (a Transformer, an
    encoder, a decoder, or a layer itself) tensor-parallel over tp, in place: its attention
    blocks ParallelMultiheadAttention, linear1 column- and linear2 row-parallel, the dropout
    between them drawing from the rank's fork. Returns the module."""
    if tp.sequence_parallel:
        raise ValueError("the encoder-decoder layers do not implement sequence parallelism: build the "
                         "TensorParallel with sequence_parallel=False")
    layers = [m for m in module.modules() if isinstance(m, (TransformerEncoderLayer, TransformerDecoderLayer))]
    if not layers:
        raise ValueError(f"parallelize_transformer: {type(module).__name__} holds no "
                         "TransformerEncoderLayer or TransformerDecoderLayer")
    for layer in layers:
        tp.check_divisible("the feed-forward width dim_feedforward", layer.linear1.out_features)
        layer.self_attn = ParallelMultiheadAttention.from_module(layer.self_attn, tp)
        if isinstance(layer, TransformerDecoderLayer):
            layer.multihead_attn = ParallelMultiheadAttention.from_module(layer.multihead_attn, tp)
        layer.linear1 = ColumnParallelLinear.from_linear(layer.linear1, tp)
        layer.linear2 = RowParallelLinear.from_linear(layer.linear2, tp)
        layer.dropout.generator = tp.generator
    return module
