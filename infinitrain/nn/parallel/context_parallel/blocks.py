"""The block products both CP attentions run: this rank's query chunks against a set of key
chunks (its own, a neighbour's, or the whole sequence), causal at the chunk level.

A query chunk i sees the key chunks j <= i. The key chunks a rank holds are in ascending order,
so the ones a query chunk sees are a prefix of them; when that prefix ends in chunk i itself
the product is causal (the kernel's mask is aligned to the bottom right, which is exactly the
diagonal block after full blocks), otherwise full. Outputs are merged into float32 running
results by the log-sum-exp rule; the backward pass recomputes each block from the whole row's
output and log-sum-exp, so its dq is that block's part and its dk, dv are the block's own."""
from __future__ import annotations

from .... import creation
from ....dtypes import float32
from ....kernels import neural as knn


def running_result(q):
    """The float32 output [B, H, T, D] and log-sum-exp [B, H, T] that blocks merge into (empty:
    lse -inf)."""
    B, H, T, D = q.shape
    return (creation.zeros(B, H, T, D, dtype=float32, device=q.device),
            creation.full((B, H, T), float("-inf"), dtype=float32, device=q.device))


def _visible(q_chunk: int, kv_chunks) -> int:
    """How many of kv_chunks (ascending) query chunk q_chunk sees: a prefix."""
    return sum(1 for j in kv_chunks if j <= q_chunk)


def _rows(t, start: int, n: int):
    return t[:, :, start:start + n]


def attend(q, k, v, q_chunks, kv_chunks, c: int, out, lse, scale: float) -> None:
    """Merges into out [B, H, Tq, D] / lse [B, H, Tq] (float32) the attention of the query
    chunks (q's rows, c each) to the key chunks of k, v [B, H_kv, Tk, D] (c rows each)."""
    for i, chunk in enumerate(q_chunks):
        n = _visible(chunk, kv_chunks)
        if n == 0:
            continue
        o, l_ = knn.attention(_rows(q, i * c, c), _rows(k, 0, n * c), _rows(v, 0, n * c), scale,
                              causal=kv_chunks[n - 1] == chunk)
        knn.attention_merge(out, lse, o, l_, row_offset=i * c)


def attend_backward(dout, q, k, v, out, lse, q_chunks, kv_chunks, c: int, dq, dk, dv,
                    scale: float) -> None:
    """Adds this block set's gradients: into dq [B, H, Tq, D] and dk, dv [B, H_kv, Tk, D]
    (float32 accumulators). out, lse: the rows' final attention output and log-sum-exp."""
    for i, chunk in enumerate(q_chunks):
        n = _visible(chunk, kv_chunks)
        if n == 0:
            continue
        r = slice(i * c, (i + 1) * c)
        gq, gk, gv = knn.attention_backward(
            dout[:, :, r], q[:, :, r], _rows(k, 0, n * c), _rows(v, 0, n * c), out[:, :, r],
            lse[:, :, r], scale, causal=kv_chunks[n - 1] == chunk)
        dq[:, :, r].add_(gq)
        _rows(dk, 0, n * c).add_(gk)
        _rows(dv, 0, n * c).add_(gv)
