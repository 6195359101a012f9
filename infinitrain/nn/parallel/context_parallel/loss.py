"""The loss under context parallelism: each rank holds the targets of its part of every
sequence. Its sum of token losses is divided by the token count of the whole sequences (the
count all-reduced over CP, so ignore_index tokens anywhere count right), then the parts are
all-reduced: every CP rank holds the one-process mean loss.

Backward: the gradient times CP. The DP x CP group averages gradients (divides by DP·CP),
while a sample's gradient is the sum of its CP parts: scaling by CP here makes that average the
mean over DP of whole-sample gradients (Megatron scales its loss by the CP size for the same
reason)."""
from __future__ import annotations

from ....autograd import Function
from ....dtypes import float32
from ..process_group import ReduceOp


class _LossOverCP(Function):
    """All-reduce (sum) in forward; the gradient times CP in backward."""

    @staticmethod
    def forward(ctx, part, group):
        ctx.size = group.size
        total = part.contiguous().clone()
        group.all_reduce(total, ReduceOp.SUM)
        return total

    @staticmethod
    def backward(ctx, g):
        return g * ctx.size, None


def loss_over_cp(local_sum, targets, group, ignore_index: int = -100):
    """local_sum: this rank's summed token losses (a scalar); targets: its targets."""
    count = (targets != ignore_index).sum().to(float32).reshape(())
    count = count.contiguous()
    group.all_reduce(count, ReduceOp.SUM)
    return _LossOverCP.apply(local_sum.float() / count, group)
