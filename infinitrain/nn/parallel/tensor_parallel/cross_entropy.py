"""The cross-entropy of logits whose vocabulary is split over TP (Megatron's cross_entropy.py)."""
from __future__ import annotations

from .... import creation
from ....autograd import Function
from ....dtypes import float32
from ....functions import cat
from ...._native import lib
from ....kernels import elementwise as ew
from ....kernels import index as kindex
from ....tensor import Tensor
from ..process_group import ReduceOp
from .shard import TensorParallel


class _VocabParallelCrossEntropy(Function):
    """Mean cross-entropy of logits whose columns (the vocabulary) are split over TP. Three
    numbers per row cross the group: the max (all-reduce MAX), then the target's logit and the
    sum of exponentials (one all-reduce SUM of both; with label smoothing the sum of the logits
    joins them). Columns at or beyond `vocab` (padding) never enter the softmax. The backward
    pass needs no communication.

    Label smoothing e (PyTorch's): (1 - e) (lse - x_t) + e (lse - mean_j x_j), whose gradient
    is softmax - (1 - e) [j = t] - e / vocab."""

    @staticmethod
    def forward(ctx, logits, targets, vocab, start, group, ignore_index, reduction, smoothing):
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
        parts = [picked]
        if smoothing:  # the shifted logits' sum, before they are exponentiated in place
            parts.append(e.sum(dim=-1) if valid else creation.zeros(N, device=logits.device))
        ew.unary(lib.IT_EXP, e, out=e)
        sums = cat(parts + [e.sum(dim=-1)]).contiguous()
        group.all_reduce(sums, ReduceOp.SUM)
        picked, sum_exp = sums[:N], sums[-N:]
        ew.binary(lib.IT_DIV, e, sum_exp.unsqueeze(1), out=e)  # the softmax
        keep = (t != ignore_index)
        # the mean's divisor, counted on the device (no host synchronisation); 1 for the sum
        count = keep.sum().float().clamp(min=1.0) if reduction == "mean" else creation.ones(device=logits.device)
        lse = sum_exp.log()
        losses = lse - picked
        if smoothing:
            losses = losses * (1.0 - smoothing) + (lse - sums[N:2 * N] / vocab) * smoothing
        losses = losses.masked_fill(~keep, 0.0)
        ctx.meta = (logits.shape, logits.dtype, valid, count, vocab, smoothing)
        ctx.save_for_backward(e, local_t, mine & keep, keep)
        return losses.sum() / count

    @staticmethod
    def backward(ctx, g):
        softmax, local_t, hit, keep = ctx.saved_tensors
        shape, dtype, valid, count, vocab, smoothing = ctx.meta
        d = softmax.clone() if ctx.retain_graph else softmax  # d loss_i / d logit_ij =
        if valid:                                 # softmax_ij - (1 - e) [j is the target] - e / V
            kindex.scatter_add(d, 1, local_t.unsqueeze(1).contiguous(),
                               (hit.float() * -(1.0 - smoothing)).unsqueeze(1).contiguous())
            if smoothing:
                ew.scalar(lib.IT_SCALAR_ADD, d, -smoothing / vocab, out=d)
        ew.binary(lib.IT_MUL, d, (keep.float() * (g.float() / count)).unsqueeze(1), out=d)
        if valid == shape[1] and dtype is d.dtype:
            return d, None, None, None, None, None, None, None
        grad = creation.zeros(*shape, dtype=dtype, device=d.device)
        if valid:
            grad[:, :valid] = d.to(dtype)
        return grad, None, None, None, None, None, None, None


def vocab_parallel_cross_entropy(logits: Tensor, targets: Tensor, vocab: int, tp: TensorParallel,
                                 ignore_index: int = -100, reduction: str = "mean",
                                 label_smoothing: float = 0.0) -> Tensor:
    """logits [N, V/TP] (this rank's vocabulary columns, padded columns last), targets [N]
    (ids in the full vocabulary): the mean (or, reduction="sum", the sum) of the loss over
    non-ignored rows, equal on every rank; label_smoothing as F.cross_entropy's."""
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"vocab_parallel_cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"vocab_parallel_cross_entropy: reduction must be 'mean' or 'sum', not {reduction!r}")
    if logits.ndim != 2 or targets.shape != (logits.shape[0],):
        raise ValueError(f"vocab_parallel_cross_entropy: logits [N, V/TP] and targets [N], got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    start = tp.rank * logits.shape[1]
    return _VocabParallelCrossEntropy.apply(logits, targets, vocab, start, tp.group, ignore_index, reduction,
                                            float(label_smoothing))
