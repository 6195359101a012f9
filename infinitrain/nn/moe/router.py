"""The router of a mixture-of-experts layer: which k experts each token goes to, with what
weights, and the per-sequence quantities that depend on the routing (the auxiliary losses, the
capacity's drops).

The gate's product and the scores are computed in float32 even under bf16 autocast (as
Megatron's router does): the top-k choice must not flip with the rounding of the activations.
Scores are softmax or sigmoid of the logits; with a selection bias (DeepSeek-V3's bias-based
balancing) the top-k is taken over scores + bias, the weights are still the scores.
"""
from __future__ import annotations

import numpy as np

from ... import amp
from ...creation import from_numpy
from ...ops.index import gather, topk
from .. import functional as F


def router_logits(x, weight):
    """x [N, C] @ weight [E, C]^T in float32, autocast off."""
    with amp.dtype_set(None):
        return F.linear(x.float(), weight.float())


def scores_of(logits, score_function: str):
    return F.softmax(logits, -1) if score_function == "softmax" else F.sigmoid(logits)


def top_k_routing(scores, k: int, norm_topk_prob: bool, selection_bias=None):
    """scores [N, E] -> (expert ids [N, k] int64, weights [N, k] float32). The choice is made
    on scores + selection_bias (no gradient through it); the weights are the chosen scores,
    divided by their sum when norm_topk_prob."""
    select = scores.detach()
    if selection_bias is not None:
        select = select + selection_bias.float().reshape(1, -1)
    _, ids = topk(select, k, -1)
    weights = gather(scores, 1, ids)
    if norm_topk_prob:
        weights = weights / weights.sum(-1, keepdim=True)
    return ids, weights


def counts_per_sequence(ids_host: np.ndarray, num_experts: int) -> np.ndarray:
    """ids_host [B, T, k] -> [B, E]: each sequence's assignments per expert (float64)."""
    B = ids_host.shape[0]
    flat = ids_host.reshape(B, -1) + np.arange(B)[:, None] * num_experts
    return np.bincount(flat.reshape(-1), minlength=B * num_experts).reshape(B, num_experts).astype(np.float64)


def load_balancing_loss(scores, counts, k: int, seq_len: int, score_function: str):
    """This rank's part of the mean over sequences of E * sum_e f_e * P_e (Switch / GShard):
    scores [B, T_local, E] of this rank's tokens, counts [B, E] the WHOLE sequences' assignments
    (summed over the ranks a sequence is split over), seq_len the whole sequences' length. The
    parts of the ranks a sequence is split over sum to the loss. A sigmoid router's scores are
    normalised per token first (DeepSeek-V3's sequence-wise loss)."""
    E = scores.shape[-1]
    if score_function == "sigmoid":
        scores = scores / scores.sum(-1, keepdim=True)
    prob_sums = scores.sum(1)  # [B, E]: this rank's tokens' sum of each expert's probability
    c = from_numpy(counts.astype(np.float32)).to(device=scores.device)
    return (prob_sums * c).sum(-1).mean() * (E / (k * seq_len * seq_len))


def z_loss(logits, seq_len: int):
    """This rank's part of the mean over sequences of mean_t logsumexp(logits_t)^2 (ST-MoE):
    logits [B, T_local, E]; the parts sum to the loss over the ranks a sequence is split over."""
    lse = F.logsumexp(logits, -1)  # [B, T_local]
    return (lse * lse).sum(-1).mean() / seq_len


def capacity(factor: float, seq_len: int, k: int, num_experts: int) -> int:
    """Switch's expert capacity, per expert and per sequence: ceil(factor * T * k / E)."""
    return int(np.ceil(factor * seq_len * k / num_experts))


def capacity_keep(ids_host: np.ndarray, num_experts: int, cap: int) -> np.ndarray:
    """ids_host [B, T, k] -> bool [B, T, k]: the assignments kept when each expert takes at most
    `cap` assignments of each sequence. Within a sequence, assignments queue for their expert
    in this order: all first choices (by position in the sequence), then all second choices,
    and so on; the first `cap` of each expert's queue are kept (a token's first choice is
    never dropped in favour of another token's second)."""
    B, T, k = ids_host.shape
    queued = ids_host.transpose(0, 2, 1).reshape(B, k * T)  # [B, (choice, position)]
    key = (queued + np.arange(B)[:, None] * num_experts).reshape(-1)
    order = np.argsort(key, kind="stable")  # grouped by (sequence, expert), queue order inside
    sorted_key = key[order]
    starts = np.searchsorted(sorted_key, sorted_key, side="left")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size) - starts
    keep = (rank < cap).reshape(B, k, T).transpose(0, 2, 1)
    return np.ascontiguousarray(keep)
