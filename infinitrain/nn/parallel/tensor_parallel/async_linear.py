"""A column-parallel linear layer's product fused with its communication, so that backward
overlaps the collectives with the products (Megatron's
`linear_with_grad_accumulation_and_async_allreduce`):

    forward     [all-gather x along the sequence (SP)], then y = x Wᵀ + b
    backward    grad_x = g W        while x is all-gathered again (SP)
                grad_W = gᵀ x       while grad_x is reduce-scattered (SP) or all-reduced (TP)

Under SP only this rank's block of x is kept for backward, not the gathered sequence: the
all-gather is paid again in backward, where it runs beside grad_x's product. The arithmetic is
that of gather_from_sp / copy_to_tp followed by F.linear (the same products, conversions and
sums in the same dtypes), so the results are the same bits; only the order in which the work
is issued changes. The collectives overlap where the group can move bytes while the kernels
compute: NCCL's stream, or the MPI group's communication thread (two or more cores per rank).
"""
from __future__ import annotations

from .... import amp
from ...._native import lib
from ....autograd import Function
from ....dtypes import float32
from ....kernels import matmul as kmm
from ....kernels import reduce as kred
from ....kernels.memory import convert
from .mappings import _all_gather_dim, _all_reduce, _reduce_scatter_dim


class _LinearWithAsyncComm(Function):
    weight_inputs = (1, 2)

    @staticmethod
    def forward(ctx, x, weight, bias, group, sequence_parallel, low):
        # x in the products' dtype (amp.lower's rule) before it travels: the same values,
        # and fewer bytes under autocast
        ctx.x_dtype = x.dtype
        xl = convert(x, low) if low is not None else x
        total = _all_gather_dim(xl, group, 1) if sequence_parallel else xl
        x2 = total.reshape(-1, total.shape[-1])
        ctx.save_for_backward(xl if sequence_parallel else x2, weight)
        ctx.group, ctx.sequence_parallel, ctx.total_shape = group, sequence_parallel, total.shape
        ctx.has_bias = bias is not None
        return kmm.linear(x2, weight, bias).reshape(total.shape[:-1] + (weight.shape[0],))

    @staticmethod
    def backward(ctx, g):
        saved, weight = ctx.saved_tensors
        group, sp = ctx.group, ctx.sequence_parallel
        g2 = g.reshape(-1, g.shape[-1])
        gather_x = sp and ctx.needs_input_grad[1]  # x serves grad_W only (a deferred backward's W)
        if gather_x:
            gather, gathered = _all_gather_dim(saved, group, 1, async_op=True)
        gx = summing = None
        if ctx.needs_input_grad[0]:
            gx = kmm.matmul(g2, weight).reshape(ctx.total_shape)  # while x is gathered
            if gx.dtype is not ctx.x_dtype:
                gx = convert(gx, ctx.x_dtype)
        if gather_x:
            gather.wait()
            x2 = gathered().reshape(-1, ctx.total_shape[-1])
        else:
            x2 = saved
        if gx is not None:
            summing, gx = (_reduce_scatter_dim(gx, group, 1, async_op=True) if sp
                           else _all_reduce(gx, group, async_op=True))
        gw = kmm.matmul(g2.t(), x2) if ctx.needs_input_grad[1] else None  # while grad_x is summed
        gb = kred.reduce(lib.IT_SUM, g2, 0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        if summing is not None:
            summing.wait()
        return gx, gw, gb, None, None, None


def linear_with_async_comm(x, weight, bias, group, sequence_parallel: bool):
    """copy_to_tp (or gather_from_sp under SP) then F.linear, with backward's collectives
    overlapped with its products."""
    weight, bias = amp.lower(weight, bias)
    low = amp.autocast_dtype() if x.dtype is float32 else None
    return _LinearWithAsyncComm.apply(x, weight, bias, group, sequence_parallel, low)
