"""The differentiable collectives of tensor and sequence parallelism (Megatron's mappings.py,
picotron's tp_communications.py), each "X in forward, Y in backward":

    copy_to_tp              identity                all-reduce
    reduce_from_tp          all-reduce              identity
    scatter_to_tp           own slice of last dim   all-gather along last dim
    gather_from_tp          all-gather last dim     own slice
    gather_from_sp          all-gather sequence     reduce-scatter along sequence
    reduce_scatter_to_sp    reduce-scatter sequence all-gather along sequence
    scatter_to_sp           own slice of sequence   all-gather along sequence

Each is the identity on a group of one.
"""
from __future__ import annotations

from .... import creation
from ....autograd import Function
from ....tensor import Tensor
from ..process_group import ProcessGroup, ReduceOp


# ---- collectives along a dimension (no autograd) ------------------------------------------

def _all_gather_dim(x: Tensor, group: ProcessGroup, dim: int, async_op: bool = False):
    """Concatenation along dim of every rank's x, in rank order. async_op: (Work, result), where
    result() gives the concatenation once the Work is done."""
    dim %= x.ndim
    src = x.contiguous()
    buf = creation.empty(group.size, *src.shape, dtype=src.dtype, device=src.device)
    work = group.all_gather(buf, src, async_op=async_op)

    def result() -> Tensor:
        if dim == 0:
            return buf.reshape(group.size * src.shape[0], *src.shape[1:])
        order = list(range(1, dim + 1)) + [0] + list(range(dim + 1, src.ndim + 1))
        shape = list(src.shape)
        shape[dim] *= group.size
        return buf.permute(*order).contiguous().reshape(*shape)
    return (work, result) if async_op else result()


def _reduce_scatter_dim(x: Tensor, group: ProcessGroup, dim: int, async_op: bool = False):
    """This rank's block along dim of the sum over ranks of x (async_op: (Work, block), the
    block filled once the Work is done)."""
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
    work = group.reduce_scatter(out, src, ReduceOp.SUM, async_op=async_op)
    return (work, out) if async_op else out


def _split_dim(x: Tensor, group: ProcessGroup, dim: int) -> Tensor:
    dim %= x.ndim
    n = x.shape[dim] // group.size
    index = [slice(None)] * x.ndim
    index[dim] = slice(group.rank * n, (group.rank + 1) * n)
    return x[tuple(index)].contiguous()


def _all_reduce(x: Tensor, group: ProcessGroup, async_op: bool = False):
    """The sum over ranks of x, in a new tensor (async_op: (Work, sum), filled once it is done)."""
    out = x.contiguous().clone()
    work = group.all_reduce(out, ReduceOp.SUM, async_op=async_op)
    return (work, out) if async_op else out


def _check_split(x: Tensor, group: ProcessGroup, dim: int, what: str) -> None:
    if x.shape[dim] % group.size:
        raise ValueError(f"{what}: size {x.shape[dim]} of dim {dim} (shape {tuple(x.shape)}) is not "
                         f"divisible by tensor parallel {group.size}")


# ---- the differentiable collectives ------------------------------------------------------

class _CopyToTP(Function):
    """Identity in forward, all-reduce in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g, ctx.group), None


class _ReduceFromTP(Function):
    """All-reduce in forward, identity in backward."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _ScatterToTP(Function):
    """This rank's slice of the last dim in forward, all-gather along it in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_dim(x, group, -1)

    @staticmethod
    def backward(ctx, g):
        return _all_gather_dim(g, ctx.group, -1), None


class _GatherFromTP(Function):
    """All-gather along the last dim in forward, this rank's slice in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_dim(x, group, -1)

    @staticmethod
    def backward(ctx, g):
        return _split_dim(g, ctx.group, -1), None


class _GatherFromSP(Function):
    """All-gather along the sequence in forward, reduce-scatter along it in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_dim(x, group, 1)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter_dim(g, ctx.group, 1), None


class _ReduceScatterToSP(Function):
    """Reduce-scatter along the sequence in forward, all-gather along it in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_dim(x, group, 1)

    @staticmethod
    def backward(ctx, g):
        return _all_gather_dim(g, ctx.group, 1), None


class _ScatterToSP(Function):
    """This rank's slice of the sequence in forward, all-gather along it in backward."""

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
