"""The differentiable token exchange of expert parallelism (as tensor_parallel/mappings.py,
picotron's tp_communications.py), each "X in forward, Y in backward":

    dispatch_rows   all-to-all to the experts' ranks, regrouped by local expert   combine_rows' forward
    combine_rows    regrouped by source rank, all-to-all back to the tokens' ranks  dispatch_rows' forward

Each rank takes part in every all-to-all whatever its rows (none included), so a rank whose
experts receive no token never leaves the others waiting.
"""
from __future__ import annotations

from dataclasses import dataclass

from ....autograd import Function
from ....kernels.index import index_select
from ....tensor import Tensor, _empty
from ..process_group import ProcessGroup


@dataclass(frozen=True)
class Exchange:
    """How rows travel between the EP ranks of `group` (host ints, the same for any row width):
    send[r]: rows this rank sends to rank r; recv[s]: rows it receives from rank s. Received
    rows arrive as [source rank][local expert]; by_expert (an index over them) puts them as
    [local expert][source rank], and by_source (its inverse) back."""
    group: ProcessGroup
    send: tuple
    recv: tuple
    by_expert: Tensor
    by_source: Tensor


def _all_to_all(x: Tensor, group: ProcessGroup, out_rows: tuple, in_rows: tuple) -> Tensor:
    """x's rows, in blocks of in_rows to each rank; returns the blocks of out_rows from each."""
    x = x.contiguous()
    out = _empty((sum(out_rows),) + tuple(x.shape[1:]), x.dtype, x.device)
    group.all_to_all_single(out, x, list(out_rows), list(in_rows))
    return out


def _to_experts(x: Tensor, ex: Exchange) -> Tensor:
    return index_select(_all_to_all(x, ex.group, ex.recv, ex.send), 0, ex.by_expert)


def _to_tokens(y: Tensor, ex: Exchange) -> Tensor:
    return _all_to_all(index_select(y.contiguous(), 0, ex.by_source), ex.group, ex.send, ex.recv)


class _DispatchRows(Function):
    """All-to-all to the experts (rows grouped by local expert) in forward, back in backward."""

    @staticmethod
    def forward(ctx, x, exchange):
        ctx.exchange = exchange
        return _to_experts(x, exchange)

    @staticmethod
    def backward(ctx, g):
        return _to_tokens(g, ctx.exchange), None


class _CombineRows(Function):
    """All-to-all back to the tokens' ranks in forward, to the experts in backward."""

    @staticmethod
    def forward(ctx, y, exchange):
        ctx.exchange = exchange
        return _to_tokens(y, exchange)

    @staticmethod
    def backward(ctx, g):
        return _to_experts(g, ctx.exchange), None


def dispatch_rows(x: Tensor, exchange: Exchange) -> Tensor:
    return _DispatchRows.apply(x, exchange)


def combine_rows(y: Tensor, exchange: Exchange) -> Tensor:
    return _CombineRows.apply(y, exchange)
