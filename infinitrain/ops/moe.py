"""The token movements and products of a mixture-of-experts layer, each a differentiable
operation: the routing's order (sort the (token, choice) assignments by expert), the
permutation (gather each assignment's token row), the experts' products (one grouped linear
for all experts, each over its own rows), and the weighted scatter back.

    order = sort_by_expert(expert_ids, num_experts)        # host-side: who goes where
    xs = permute(x, order.rows)                              # [A, C]: rows grouped by expert
    h = grouped_linear(xs, [w_0, ..., w_E-1], order.counts)  # expert e's rows times w_e^T
    y = unpermute(h, order.rows, weights, num_tokens)        # sum over a token's k choices

Assignments are ordered by expert, then by token, then by choice (a stable sort of the
flattened [tokens, k] ids), so the result is the same whatever the kernels' threading. Each is
a native kernel on the tensors' device (kernels/moe.py): the sort a counting sort, the scatter
back a per-token sum in a fixed order (no atomics), the products one grouped call forward and
one per backward form.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import amp
from .. import dtypes as _dt
from ..autograd import Function
from ..kernels import moe as kmoe
from ..tensor import Tensor


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
    assignments that are not dropped (a capacity factor's decision): dropped ones get no row.
    Runs on the ids' device; the counts come back to the host."""
    if int(num_experts) < 1:
        raise ValueError(f"sort_by_expert: num_experts must be >= 1, got {num_experts}")
    rows, slots, counts = kmoe.sort(expert_ids.detach(), int(num_experts),
                                    keep.detach() if keep is not None else None)
    return ExpertOrder(rows=rows, slots=slots, counts=counts)


class Permute(Function):
    """out[a] = x[rows[a]]; the gradient sums each token's rows back (a fixed order per token)."""

    @staticmethod
    def forward(ctx, x, rows):
        ctx.save_for_backward(rows)
        ctx.num_tokens = x.shape[0]
        return kmoe.permute(x, rows)

    @staticmethod
    def backward(ctx, g):
        rows, = ctx.saved_tensors
        return kmoe.unpermute(g, rows, None, ctx.num_tokens), None


class Unpermute(Function):
    """out[t] = sum over the assignments a of token t of weights[a] * y[a]."""

    @staticmethod
    def forward(ctx, y, rows, weights, num_tokens):
        ctx.save_for_backward(y, rows, weights)
        return kmoe.unpermute(y, rows, weights, num_tokens)

    @staticmethod
    def backward(ctx, g):
        y, rows, weights = ctx.saved_tensors
        gy, gw = kmoe.unpermute_backward(g, y, rows, weights, ctx.needs_input_grad[0], ctx.needs_input_grad[2])
        return gy, None, gw, None


def permute(x: Tensor, rows: Tensor) -> Tensor:
    """x [N, C] -> [A, C]: row a is x[rows[a]] (the gradient sums back into each token)."""
    return Permute.apply(x, rows)


def unpermute(y: Tensor, rows: Tensor, weights: Tensor, num_tokens: int) -> Tensor:
    """y [A, C] in expert order -> [num_tokens, C]: each token's rows summed, weighted by its
    routing weights [A] (gradients to y and to the weights)."""
    weights = weights.to(dtype=y.dtype) if weights.dtype is not y.dtype else weights
    return Unpermute.apply(y, rows, weights, int(num_tokens))


class GroupedLinear(Function):
    """y[rows of e] = x[rows of e] @ weights[e]^T for each expert e, its rows consecutive: one
    native call forward, one for the input's gradient and one for all the weights'."""

    @staticmethod
    def forward(ctx, x, counts, *weights):
        ctx.save_for_backward(x, *weights)
        ctx.counts = counts
        return kmoe.grouped_linear(x, weights, counts)

    @staticmethod
    def backward(ctx, g):
        x, *weights = ctx.saved_tensors
        gx = kmoe.grouped_linear_backward_input(g, weights, ctx.counts) if ctx.needs_input_grad[0] else None
        # every expert gets a gradient, zeros for one that received no token: every rank's
        # gradient buckets fill the same way whatever the routing did
        gws = kmoe.grouped_linear_backward_weight(g, x, ctx.counts) if any(ctx.needs_input_grad[2:]) \
            else [None] * len(weights)
        return (gx, None, *gws)


def grouped_linear(x: Tensor, weights, counts) -> Tensor:
    """x [A, in] with counts[e] consecutive rows for expert e; weights: one [out, in] matrix per
    expert (a Linear's layout). Returns [A, out]."""
    if x.ndim != 2:
        raise ValueError(f"grouped_linear: the input must be [rows, in_features], got shape {tuple(x.shape)}")
    weights = list(weights)
    counts = tuple(int(n) for n in counts)
    if len(weights) != len(counts):
        raise ValueError(f"grouped_linear: {len(weights)} weights but {len(counts)} counts")
    if any(n < 0 for n in counts) or sum(counts) != x.shape[0]:
        raise ValueError(f"grouped_linear: the counts {list(counts)} must be >= 0 and sum to the "
                         f"input's {x.shape[0]} rows")
    shapes = {tuple(w.shape) for w in weights}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2 or next(iter(shapes))[1] != x.shape[-1]:
        raise ValueError(f"grouped_linear: every weight must be [out, {x.shape[-1]}], got {sorted(shapes)}")
    x, *weights = amp.lower(x, *weights)
    if x.dtype not in (_dt.float32, _dt.float64, _dt.bfloat16, _dt.float16):
        raise TypeError(f"grouped_linear: floating inputs only, got {x.dtype}")
    return GroupedLinear.apply(x, counts, *weights)
