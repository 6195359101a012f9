"""Differentiable communication for model parallelism (Megatron's f/g operators): what each
does forward, its gradient does backward in the dual collective."""
from __future__ import annotations

from ...autograd import Function
from ...creation import empty
from .process_group import ReduceOp


class CopyToGroup(Function):
    """Forward: identity. Backward: all-reduce (sum) the gradient over the group."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        ctx.group.all_reduce(g, ReduceOp.SUM)
        return g, None


class ReduceFromGroup(Function):
    """Forward: all-reduce (sum). Backward: identity."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.contiguous().clone()
        group.all_reduce(out, ReduceOp.SUM)
        return out

    @staticmethod
    def backward(ctx, g):
        return g, None


class GatherFromGroup(Function):
    """Forward: all-gather along the last dimension. Backward: keep this rank's slice."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        n = x.shape[-1]
        chunks = empty(group.size, *x.shape, dtype=x.dtype)
        group.all_gather(chunks, x.contiguous())
        dims = list(range(1, x.ndim + 1))
        return chunks.permute(*dims[:-1], 0, dims[-1]).reshape(*x.shape[:-1], group.size * n)

    @staticmethod
    def backward(ctx, g):
        n = g.shape[-1] // ctx.group.size
        return g.narrow(-1, ctx.group.rank * n, n).contiguous(), None


class ScatterToGroup(Function):
    """Forward: keep this rank's slice of the last dimension. Backward: all-gather."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        n = x.shape[-1] // group.size
        return x.narrow(-1, group.rank * n, n).contiguous()

    @staticmethod
    def backward(ctx, g):
        return GatherFromGroup.forward(ctx, g, ctx.group), None


def copy_to_group(x, group):
    return CopyToGroup.apply(x, group)


def reduce_from_group(x, group):
    return ReduceFromGroup.apply(x, group)


def gather_from_group(x, group):
    return GatherFromGroup.apply(x, group)


def scatter_to_group(x, group):
    return ScatterToGroup.apply(x, group)
