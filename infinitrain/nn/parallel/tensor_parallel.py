"""Tensor parallelism and sequence parallelism, as Megatron-LM lays them out.

A TP group of ranks splits each layer's weights: a ColumnParallelLinear holds a block of the
output features, a RowParallelLinear a block of the input features, a VocabParallelEmbedding a
block of the vocabulary rows. Between those layers activations are either replicated on every
TP rank or, under sequence parallelism (SP), split along the sequence (dim 1 of [B, T, C]),
which divides the memory of norms, residuals and dropout by TP.

The differentiable collectives (forward / backward):

    copy_to_tp              identity                all-reduce
    reduce_from_tp          all-reduce              identity
    scatter_to_tp           own slice of last dim   all-gather along last dim
    gather_from_tp          all-gather last dim     own slice
    gather_from_sp          all-gather sequence     reduce-scatter along sequence
    reduce_scatter_to_sp    reduce-scatter sequence all-gather along sequence
    scatter_to_sp           own slice of sequence   all-gather along sequence

Parameters carry how they are laid out, so that initialisation, checkpoints and gradient
clipping can treat every layout as the one-process model:
- `param.tp_shard` (a TPShard): the parameter is this rank's block of a larger tensor;
- `param.partial_grad_group`: the parameter is replicated but, under SP, each rank's
  gradient covers only its part of the sequence: the gradients are summed over this group
  after backward (finalize.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import amp, creation
from ...autograd import Function, no_grad
from ...functions import cat
from ...dtype import float32
from ..._native import check, lib
from ...kernels import elementwise as ew
from ...kernels import index as kindex
from ...tensor import Tensor
from .. import functional as F
from .. import init
from ..module import Module
from ..modules import Linear
from ..parameter import Parameter
from .process_group import ProcessGroup, ReduceOp


@dataclass(frozen=True)
class TensorParallel:
    """What a model needs to know to build its layers tensor-parallel: the TP group and
    whether activations between TP regions are split along the sequence."""
    group: ProcessGroup
    sequence_parallel: bool = False

    @property
    def size(self) -> int:
        return self.group.size

    @property
    def rank(self) -> int:
        return self.group.rank

    def check_divisible(self, what: str, n: int) -> int:
        """n // TP, or a clear error naming the sizes."""
        if n % self.size:
            raise ValueError(f"tensor parallel {self.size} does not divide {what} ({n}); choose a "
                             f"tensor-parallel size that divides {n}")
        return n // self.size


class TPShard:
    """How a parameter is split: along `dim`, the full tensor is a run of `blocks` (for a fused
    q|k|v weight, three blocks), and each block is cut into `group.size` equal pieces; rank r
    holds piece r of every block, in block order. `full_size` (one block only) is the true size
    along dim when the blocks were padded to a multiple of the group (a vocabulary of 50257 on
    TP 2 is held as 2 x 25129 rows, the last one zero)."""

    def __init__(self, group: ProcessGroup, dim: int, blocks, full_size: int | None = None):
        self.group, self.dim, self.blocks = group, dim, tuple(int(b) for b in blocks)
        for b in self.blocks:
            if b % group.size:
                raise ValueError(f"a block of {b} along dim {dim} cannot be split over "
                                 f"tensor parallel {group.size}")
        if full_size is not None and len(self.blocks) != 1:
            raise ValueError("padding is supported for single-block shards only")
        self.full_size = full_size if full_size is not None else sum(self.blocks)

    def full_shape(self, local_shape) -> tuple:
        s = list(local_shape)
        s[self.dim] = self.full_size
        return tuple(s)

    def pieces(self, rank: int):
        """(start, stop) along dim of rank's pieces in the padded full tensor."""
        at, out = 0, []
        for b in self.blocks:
            n = b // self.group.size
            out.append((at + rank * n, at + (rank + 1) * n))
            at += b
        return out

    def take(self, full: Tensor) -> Tensor:
        """This rank's part of the full tensor (a contiguous copy)."""
        a = _as_numpy(full)
        if a.shape[self.dim] != self.full_size:
            raise ValueError(f"expected {self.full_size} along dim {self.dim}, got shape {a.shape}")
        pad = sum(self.blocks) - self.full_size
        if pad:
            widths = [(0, 0)] * a.ndim
            widths[self.dim] = (0, pad)
            a = np.pad(a, widths)
        parts = [np.take(a, np.arange(s, e), axis=self.dim) for s, e in self.pieces(self.group.rank)]
        return _from_numpy(np.ascontiguousarray(np.concatenate(parts, axis=self.dim)), full.dtype, full.device)

    @no_grad()
    def gather(self, local: Tensor) -> Tensor:
        """The full tensor from every rank's part (a collective over the group)."""
        src = local.detach().contiguous()
        buf = creation.empty(self.group.size, *src.shape, dtype=src.dtype, device=src.device)
        self.group.all_gather(buf, src)
        g = _as_numpy(buf)
        n = [b // self.group.size for b in self.blocks]
        parts, at = [], 0
        for k in n:  # block by block: the pieces of every rank, in rank order
            for r in range(self.group.size):
                parts.append(np.take(g[r], np.arange(at, at + k), axis=self.dim))
            at += k
        full = np.concatenate(parts, axis=self.dim)
        full = np.take(full, np.arange(self.full_size), axis=self.dim)
        return _from_numpy(np.ascontiguousarray(full), local.dtype, local.device)


def full_tensor(p: Tensor) -> Tensor:
    """The one-process tensor of a parameter, detached: a tensor-parallel shard is gathered (a
    collective over its TP group, so every rank of the group must call this)."""
    shard = getattr(p, "tp_shard", None)
    return shard.gather(p) if shard is not None else p.detach()


def _as_numpy(t: Tensor) -> np.ndarray:
    return t.detach().contiguous().cpu().numpy()


def _from_numpy(a: np.ndarray, dtype, device) -> Tensor:
    return creation.from_numpy(a).to(dtype=dtype, device=device)


def _shard_param(shape, shard: TPShard, dtype) -> Parameter:
    p = Parameter(creation.empty(*shape, dtype=dtype))
    p.tp_shard = shard
    return p


def mark_sequence_parallel(module: Module, tp: TensorParallel | None) -> None:
    """Marks every parameter of a module that sees sequence-split activations under SP (norms,
    row-parallel biases, position embeddings): their gradients are summed over TP."""
    if tp is not None and tp.sequence_parallel:
        for p in module.parameters():
            if getattr(p, "tp_shard", None) is None:
                p.partial_grad_group = tp.group


# ---- collectives along a dimension (no autograd) ------------------------------------------

def _all_gather_dim(x: Tensor, group: ProcessGroup, dim: int) -> Tensor:
    """Concatenation along dim of every rank's x, in rank order."""
    dim %= x.ndim
    src = x.contiguous()
    buf = creation.empty(group.size, *src.shape, dtype=src.dtype, device=src.device)
    group.all_gather(buf, src)
    if dim == 0:
        return buf.reshape(group.size * src.shape[0], *src.shape[1:])
    order = list(range(1, dim + 1)) + [0] + list(range(dim + 1, src.ndim + 1))
    shape = list(src.shape)
    shape[dim] *= group.size
    return buf.permute(*order).contiguous().reshape(*shape)


def _reduce_scatter_dim(x: Tensor, group: ProcessGroup, dim: int) -> Tensor:
    """This rank's block along dim of the sum over ranks of x."""
    dim %= x.ndim
    n = x.shape[dim] // group.size
    shape = list(x.shape)
    shape[dim] = n
    if dim == 0:
        src = x.contiguous()
    else:
        split = list(x.shape[:dim]) + [group.size, n] + list(x.shape[dim + 1:])
        order = [dim] + [i for i in range(len(split)) if i != dim]
        src = x.reshape(*split).permute(*order).contiguous()
    out = creation.empty(*shape, dtype=x.dtype, device=x.device)
    group.reduce_scatter(out, src, ReduceOp.SUM)
    return out


def _split_dim(x: Tensor, group: ProcessGroup, dim: int) -> Tensor:
    dim %= x.ndim
    n = x.shape[dim] // group.size
    index = [slice(None)] * x.ndim
    index[dim] = slice(group.rank * n, (group.rank + 1) * n)
    return x[tuple(index)].contiguous()


def _all_reduce(x: Tensor, group: ProcessGroup) -> Tensor:
    out = x.contiguous().clone()
    group.all_reduce(out, ReduceOp.SUM)
    return out


def _check_split(x: Tensor, group: ProcessGroup, dim: int, what: str) -> None:
    if x.shape[dim] % group.size:
        raise ValueError(f"{what}: size {x.shape[dim]} of dim {dim} (shape {tuple(x.shape)}) is not "
                         f"divisible by tensor parallel {group.size}")


# ---- the differentiable collectives ------------------------------------------------------

class _CopyToTP(Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g, ctx.group), None


class _ReduceFromTP(Function):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _ScatterToTP(Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_dim(x, group, -1)

    @staticmethod
    def backward(ctx, g):
        return _all_gather_dim(g, ctx.group, -1), None


class _GatherFromTP(Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_dim(x, group, -1)

    @staticmethod
    def backward(ctx, g):
        return _split_dim(g, ctx.group, -1), None


class _GatherFromSP(Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_dim(x, group, 1)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter_dim(g, ctx.group, 1), None


class _ReduceScatterToSP(Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_dim(x, group, 1)

    @staticmethod
    def backward(ctx, g):
        return _all_gather_dim(g, ctx.group, 1), None


class _ScatterToSP(Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_dim(x, group, 1)

    @staticmethod
    def backward(ctx, g):
        return _all_gather_dim(g, ctx.group, 1), None


def copy_to_tp(x: Tensor, group: ProcessGroup) -> Tensor:
    return _CopyToTP.apply(x, group) if group.size > 1 else x


def reduce_from_tp(x: Tensor, group: ProcessGroup) -> Tensor:
    return _ReduceFromTP.apply(x, group) if group.size > 1 else x


def scatter_to_tp(x: Tensor, group: ProcessGroup) -> Tensor:
    _check_split(x, group, x.ndim - 1, "scatter_to_tp")
    return _ScatterToTP.apply(x, group) if group.size > 1 else x


def gather_from_tp(x: Tensor, group: ProcessGroup) -> Tensor:
    return _GatherFromTP.apply(x, group) if group.size > 1 else x


def gather_from_sp(x: Tensor, group: ProcessGroup) -> Tensor:
    return _GatherFromSP.apply(x, group) if group.size > 1 else x


def reduce_scatter_to_sp(x: Tensor, group: ProcessGroup) -> Tensor:
    _check_split(x, group, 1, "reduce_scatter_to_sp")
    return _ReduceScatterToSP.apply(x, group) if group.size > 1 else x


def scatter_to_sp(x: Tensor, group: ProcessGroup) -> Tensor:
    _check_split(x, group, 1, "scatter_to_sp")
    return _ScatterToSP.apply(x, group) if group.size > 1 else x


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
        self.weight = _shard_param((local, in_features), shard, dtype)
        self.bias = _shard_param((local,), shard, dtype) if bias else None
        init.kaiming_uniform_linear_(self.weight)
        if self.bias is not None:
            init.uniform_(self.bias, -(in_features ** -0.5), in_features ** -0.5)

    lora_on = False  # nn.lora: lora_A whole, lora_B split as the weight's rows

    def forward(self, x):
        group = self.tp.group
        if self.tp.sequence_parallel:
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
        self.weight = _shard_param((out_features, local), TPShard(tp.group, 1, (in_features,)), dtype)
        self.bias = Parameter(creation.empty(out_features, dtype=dtype)) if bias else None
        init.kaiming_uniform_linear_(self.weight)
        if self.bias is not None:
            init.uniform_(self.bias, -(in_features ** -0.5), in_features ** -0.5)
            mark_sequence_parallel_param(self.bias, tp)

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
            return y + self.bias if self.bias is not None else y
        # Under autocast one process rounds x W^T + b to 16 bits once, after float32
        # accumulation. Rounding each rank's partial product before the sum would add a
        # rounding per rank, so the partial products of the rounded inputs are summed in float32
        # and rounded once, bias included (gradients are rounded where one process rounds them).
        with amp.autocast(enabled=False):
            xl = x.to(low).float()
            y = F.linear(xl, self.weight.to(low).float())
            if self.lora_on:
                y = y + F.lora(xl, self.lora_A.to(low).float(), self.lora_B.to(low).float(), self.lora_scale)
            y = reduce_scatter_to_sp(y, group) if self.tp.sequence_parallel else reduce_from_tp(y, group)
            if self.bias is not None:
                y = y + self.bias.to(low).float()
            return y.to(low)

    def extra_repr(self):
        return (f"in_features={self.in_features} ({self.in_features // self.tp.size} per rank), "
                f"out_features={self.out_features}, bias={self.bias is not None}")


def mark_sequence_parallel_param(p: Parameter, tp: TensorParallel) -> None:
    if tp.sequence_parallel:
        p.partial_grad_group = tp.group


class VocabParallelEmbedding(Module):
    """An embedding whose rows (the vocabulary) are split over TP: each rank looks up the ids in
    its range, zeros the others, and the partial rows are summed (all-reduced, or
    reduce-scattered along the sequence under SP). A vocabulary that TP does not divide is
    padded with zero rows that no id reaches."""

    def __init__(self, num_embeddings: int, embedding_dim: int, tp: TensorParallel, dtype=None):
        super().__init__()
        self.tp, self.num_embeddings, self.embedding_dim = tp, num_embeddings, embedding_dim
        local = -(-num_embeddings // tp.size)
        self.vocab_start = tp.rank * local
        self.vocab_end = min(num_embeddings, self.vocab_start + local)
        self.weight = _shard_param((local, embedding_dim),
                                   TPShard(tp.group, 0, (local * tp.size,), full_size=num_embeddings),
                                   dtype)
        init.normal_(self.weight)

    def forward(self, ids):
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        y = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
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


# ---- the vocabulary-parallel loss --------------------------------------------------------

class _VocabParallelCrossEntropy(Function):
    """Mean cross-entropy of logits whose columns (the vocabulary) are split over TP. Three
    numbers per row cross the group: the max (all-reduce MAX), then the target's logit and the
    sum of exponentials (one all-reduce SUM of both). Columns at or beyond `vocab` (padding)
    never enter the softmax. The backward pass needs no communication."""

    @staticmethod
    def forward(ctx, logits, targets, vocab, start, group, ignore_index):
        # One [N, V/TP] float32 buffer beyond the logits: shifted logits, exponentiated and
        # normalised in place into the softmax that backward turns into the gradient.
        N, V_local = logits.shape
        valid = max(0, min(V_local, vocab - start))  # real (unpadded) columns on this rank
        x = logits[:, :valid]
        if valid:
            row_max = x.float().amax(dim=-1) if x.dtype is not float32 else x.amax(dim=-1)
        else:
            row_max = creation.full((N,), float("-inf"), device=logits.device)
        group.all_reduce(row_max, ReduceOp.MAX)
        t = targets.reshape(-1)
        mine = (t >= start) & (t < start + valid)
        local_t = (t - start).masked_fill(~mine, 0)
        e = ew.binary(lib.IT_SUB, x.float().contiguous() if x.dtype is not float32 else x,
                      row_max.unsqueeze(1))
        if valid:
            picked = e.gather(1, local_t.unsqueeze(1)).reshape(N).masked_fill(~mine, 0.0)
        else:
            picked = creation.zeros(N, device=logits.device)
        check(lib.it_unary(e.device.native, lib.IT_EXP, e.dtype.native, e._ptr(), e._ptr(), e.numel()))
        sums = cat([picked, e.sum(dim=-1)]).contiguous()
        group.all_reduce(sums, ReduceOp.SUM)
        picked, sum_exp = sums[:N], sums[N:]
        ew.binary(lib.IT_DIV, e, sum_exp.unsqueeze(1), out=e)  # the softmax
        keep = (t != ignore_index)
        count = keep.sum().float().clamp(min=1.0)  # on the device: no host synchronisation
        losses = (sum_exp.log() - picked).masked_fill(~keep, 0.0)
        ctx.meta = (logits.shape, logits.dtype, valid, count)
        ctx.save_for_backward(e, local_t, mine & keep, keep)
        return losses.sum() / count

    @staticmethod
    def backward(ctx, g):
        softmax, local_t, hit, keep = ctx.saved_tensors
        shape, dtype, valid, count = ctx.meta
        d = softmax.clone() if ctx.retain_graph else softmax  # d loss_i / d logit_ij =
        if valid:                                             # softmax_ij - [j is the target]
            kindex.scatter_add(d, 1, local_t.unsqueeze(1).contiguous(),
                               -hit.float().unsqueeze(1).contiguous())
        ew.binary(lib.IT_MUL, d, (keep.float() * (g.float() / count)).unsqueeze(1), out=d)
        if valid == shape[1] and dtype is d.dtype:
            return d, None, None, None, None, None
        grad = creation.zeros(*shape, dtype=dtype, device=d.device)
        if valid:
            grad[:, :valid] = d.to(dtype)
        return grad, None, None, None, None, None


def vocab_parallel_cross_entropy(logits: Tensor, targets: Tensor, vocab: int, tp: TensorParallel,
                                 ignore_index: int = -100) -> Tensor:
    """logits [N, V/TP] (this rank's vocabulary columns, padded columns last), targets [N]
    (ids in the full vocabulary): the mean loss over non-ignored rows, equal on every rank."""
    if logits.ndim != 2 or targets.shape != (logits.shape[0],):
        raise ValueError(f"vocab_parallel_cross_entropy: logits [N, V/TP] and targets [N], got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    start = tp.rank * logits.shape[1]
    return _VocabParallelCrossEntropy.apply(logits, targets, vocab, start, tp.group, ignore_index)
