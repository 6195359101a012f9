"""The token movements and products of a mixture-of-experts layer, each a differentiable
operation: the routing's order (sort the (token, choice) assignments by expert), the
permutation (gather each assignment's token row), the experts' products (one grouped linear
for all experts, each over its own rows), and the weighted scatter back.

    order = sort_by_expert(expert_ids, num_experts)        # host-side: who goes where
    xs = permute(x, order.rows)                              # [A, C]: rows grouped by expert
    h = grouped_linear(xs, [w_0, ..., w_E-1], order.counts)  # expert e's rows times w_e^T
    y = unpermute(h, order.rows, weights, num_tokens)        # sum over a token's k choices

Assignments are ordered by expert, then by token, then by choice (a stable sort of the
flattened [tokens, k] ids), so the result is the same whatever the kernels' threading.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import amp
from .. import dtypes as _dt
from ..autograd import Function
from ..kernels import index as kidx
from ..kernels import matmul as kmm
from ..device import as_device
from ..tensor import Tensor, _empty


def _cpu():
    return as_device("cpu")


@dataclass(frozen=True)
class ExpertOrder:
    """rows[a]: the token (row of the flattened input) of the a-th assignment in expert order;
    slots[a]: its place in the flattened [tokens, k] choices (token * k + choice); counts[e]:
    how many assignments expert e receives (host integers: they size the grouped product and,
    under expert parallelism, the all-to-all)."""
    rows: Tensor
    slots: Tensor
    counts: tuple


def sort_by_expert(expert_ids: Tensor, num_experts: int, keep: Tensor | None = None) -> ExpertOrder:
    """expert_ids [N, k] integers in [0, num_experts); keep: an optional bool [N, k] mask of the
    assignments that are not dropped (a capacity factor's decision): dropped ones get no row."""
    if expert_ids.ndim != 2:
        raise ValueError(f"sort_by_expert: expert ids must be [tokens, k], got shape {tuple(expert_ids.shape)}")
    ids = expert_ids.detach().to(device="cpu").numpy().reshape(-1).astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= num_experts):
        raise ValueError(f"sort_by_expert: expert ids must lie in [0, {num_experts}), got "
                         f"{int(ids.min())}..{int(ids.max())}")
    slots = np.arange(ids.size, dtype=np.int64)
    if keep is not None:
        kept = keep.detach().to(device="cpu").numpy().reshape(-1).astype(bool)
        ids, slots = ids[kept], slots[kept]
    order = np.argsort(ids, kind="stable")
    slots = slots[order]
    counts = tuple(int(c) for c in np.bincount(ids, minlength=num_experts))
    device = expert_ids.device
    k = expert_ids.shape[1]
    return ExpertOrder(rows=_index_tensor(slots // k, device), slots=_index_tensor(slots, device), counts=counts)


def _index_tensor(values: np.ndarray, device) -> Tensor:
    host = _empty(values.shape, _dt.int64, _cpu())
    np.copyto(host.numpy(), values)
    return host.to(device=device)


class Unpermute(Function):
    """out[t] = sum over the assignments a of token t of weights[a] * y[a]."""

    @staticmethod
    def forward(ctx, y, rows, weights, num_tokens):
        ctx.save_for_backward(y, rows, weights)
        out = _empty((num_tokens, y.shape[1]), y.dtype, y.device).fill_(0)
        return kidx.index_add(out, 0, rows, y * weights.reshape(-1, 1))

    @staticmethod
    def backward(ctx, g):
        y, rows, weights = ctx.saved_tensors
        g_rows = kidx.index_select(g.contiguous(), 0, rows)
        gy = g_rows * weights.reshape(-1, 1) if ctx.needs_input_grad[0] else None
        gw = (g_rows * y).sum(-1) if ctx.needs_input_grad[2] else None
        return gy, None, gw, None


def permute(x: Tensor, rows: Tensor) -> Tensor:
    """x [N, C] -> [A, C]: row a is x[rows[a]] (the gradient sums back into each token)."""
    from .index import index_select
    return index_select(x, 0, rows)


def unpermute(y: Tensor, rows: Tensor, weights: Tensor, num_tokens: int) -> Tensor:
    """y [A, C] in expert order -> [num_tokens, C]: each token's rows summed, weighted by its
    routing weights [A] (gradients to y and to the weights)."""
    weights = weights.to(dtype=y.dtype) if weights.dtype is not y.dtype else weights
    return Unpermute.apply(y, rows, weights, num_tokens)


class GroupedLinear(Function):
    """y[rows of e] = x[rows of e] @ weights[e]^T for each expert e, its rows consecutive."""

    @staticmethod
    def forward(ctx, x, counts, *weights):
        ctx.save_for_backward(x, *weights)
        ctx.counts = counts
        out = _empty((x.shape[0], weights[0].shape[0]), x.dtype, x.device)
        at = 0
        for w, n in zip(weights, counts):
            if n:
                out[at:at + n] = kmm.linear(x[at:at + n], w, None)
            at += n
        return out

    @staticmethod
    def backward(ctx, g):
        x, *weights = ctx.saved_tensors
        g = g.contiguous()
        gx = _empty(x.shape, x.dtype, x.device).fill_(0) if ctx.needs_input_grad[0] else None
        gws = []
        at = 0
        for w, n in zip(weights, ctx.counts):
            if gx is not None and n:
                gx[at:at + n] = kmm.matmul(g[at:at + n], w)
            # an expert that received no token still gets a (zero) gradient: every rank's
            # gradient buckets fill the same way whatever the routing did
            gws.append(kmm.matmul(g[at:at + n].t(), x[at:at + n]) if n
                       else _empty(w.shape, w.dtype, w.device).fill_(0))
            at += n
        return (gx, None, *gws)


def grouped_linear(x: Tensor, weights, counts) -> Tensor:
    """x [A, in] with counts[e] consecutive rows for expert e; weights: one [out, in] matrix per
    expert (a Linear's layout). Returns [A, out]."""
    weights = list(weights)
    counts = tuple(int(n) for n in counts)
    if len(weights) != len(counts):
        raise ValueError(f"grouped_linear: {len(weights)} weights but {len(counts)} counts")
    if any(n < 0 for n in counts) or sum(counts) != x.shape[0]:
        raise ValueError(f"grouped_linear: the counts {list(counts)} must be >= 0 and sum to the "
                         f"input's {x.shape[0]} rows")
    shapes = {tuple(w.shape) for w in weights}
    if len(shapes) != 1 or next(iter(shapes))[1] != x.shape[-1]:
        raise ValueError(f"grouped_linear: every weight must be [out, {x.shape[-1]}], got {sorted(shapes)}")
    x, *weights = amp.lower(x, *weights)
    if x.dtype not in (_dt.float32, _dt.float64, _dt.bfloat16, _dt.float16):
        raise TypeError(f"grouped_linear: floating inputs only, got {x.dtype}")
    return GroupedLinear.apply(x.contiguous(), counts, *weights)
