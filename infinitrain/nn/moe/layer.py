"""The mixture-of-experts layer (MoE): a router, routed SwiGLU experts, optional shared ones.

    order = sort_by_expert(ids, E, keep); xs = permute(x, order.rows)
    if ep: xs, local_counts, handle = ep.dispatch(xs, order.counts)
    h = experts(xs, local_counts)            # grouped products over each expert's rows
    if ep: h = ep.combine(h, handle)
    y = unpermute(h, order.rows, weights in that order, N) (+ shared_experts(x))

Dropless by default: every token reaches its k experts. With moe_capacity_factor each expert
takes at most ceil(factor * T * k / E) assignments of each SEQUENCE (router.capacity_keep says
which: first choices before second choices, then by position in the sequence); a dropped
assignment contributes nothing (the residual carries the token). Counting per sequence makes
the drops independent of how a batch is split over ranks and micro-batches. Under sequence or
context parallelism a sequence is split over ranks and the capacity is refused.

Parallelism: under TP (which needs sequence parallelism, Megatron's rule) each TP rank routes
its own T/TP tokens through whole experts, so the router's and the routed experts' gradients
are partial sums over TP (marked as the sequence-parallel norms' are); the shared experts are
split over TP as the dense MLP. Under CP or SP the per-sequence counts the auxiliary loss needs
are summed over the ranks that hold the sequence's parts. Expert parallelism (ep) keeps only
ep.local_experts(E) here and moves the rows with ep.dispatch / ep.combine.

LoRA adapters on the routed experts or the router are refused (nn.lora): the experts' products
bypass the Linear modules. Adapt the attention (and the shared experts) instead.
"""
from __future__ import annotations

import numpy as np

from ...autograd import is_grad_enabled
from ...autograd.recompute import is_recomputing
from ...creation import from_numpy, zeros
from ...dtypes import float32
from ...ops.index import index_select
from ...ops.moe import permute, sort_by_expert, unpermute
from ..module import Module
from ..modules import Linear
from ..parallel import tensor_parallel as tpl
from . import router as R
from .aux_loss import attach_aux_loss
from .experts import Experts, SharedExperts


class MoE(Module):
    """config: a model configuration with n_embd, num_experts, moe_top_k, expert_ffn_hidden,
    moe_shared_experts, moe_router ("softmax" / "sigmoid"), moe_norm_topk_prob,
    moe_aux_loss_coeff, moe_z_loss_coeff, moe_capacity_factor (None: dropless),
    moe_bias_update_rate (> 0: DeepSeek-V3's selection bias, `gate.e_score_correction_bias`).
    tp: TensorParallel (with sequence parallelism) or None; ep: ExpertParallel or None; cp:
    the context parallelism the sequence is split by, or None."""

    def __init__(self, config, tp=None, ep=None, cp=None):
        super().__init__()
        C, E = config.n_embd, config.num_experts
        self.tp = tp if tp is not None and tp.size > 1 else None
        self.ep = ep if ep is not None and ep.size > 1 else None
        self.cp = cp if cp is not None and cp.size > 1 else None
        if self.tp is not None and not self.tp.sequence_parallel:
            raise ValueError(f"mixture-of-experts layers under tensor parallelism ({self.tp.size}) need sequence "
                             "parallelism (--sequence_parallel): each TP rank routes its own part of the sequence")
        self.split = tpl.sequence_split(self.tp) * (self.cp.size if self.cp is not None else 1)
        if config.moe_capacity_factor is not None and self.split > 1:
            raise ValueError(f"--moe_capacity_factor {config.moe_capacity_factor} counts capacity per whole "
                             f"sequence, but this layout splits each sequence over {self.split} ranks "
                             "(--sequence_parallel under --tensor_parallel, --context_parallel): train dropless "
                             "(no capacity factor) or without that split")
        self.num_experts, self.top_k = E, config.moe_top_k
        self.score_function, self.norm_topk_prob = config.moe_router, config.moe_norm_topk_prob
        self.aux_loss_coeff, self.z_loss_coeff = config.moe_aux_loss_coeff, config.moe_z_loss_coeff
        self.capacity_factor, self.bias_update_rate = config.moe_capacity_factor, config.moe_bias_update_rate
        self.gate = Linear(C, E, bias=False)
        if self.bias_update_rate > 0:
            self.gate.register_buffer("e_score_correction_bias", zeros(E, dtype=float32))
        local = self.ep.local_experts(E) if self.ep is not None else range(E)
        self.experts = Experts(C, config.expert_ffn_hidden, local)
        if self.ep is not None:  # each EP rank holds other experts: gradients reduced over their holders
            for p in self.experts.parameters():
                p.expert_parallel = True
        # the router and the routed experts see this rank's tokens only: gradients summed over TP
        tpl.mark_sequence_parallel(self.gate, self.tp)
        tpl.mark_sequence_parallel(self.experts, self.tp)
        if config.moe_shared_experts:
            self.shared_experts = SharedExperts(C, config.moe_shared_experts * config.expert_ffn_hidden, self.tp)
        self.reset_step_record()

    @property
    def selection_bias(self):
        return self.gate._buffers.get("e_score_correction_bias")

    @property
    def recompute(self) -> bool:
        """Selective recomputation (the model's set_recompute("selective") sets it, as on the
        dense MLP): the experts' activation and down products rerun in backward."""
        return self.experts.recompute

    @recompute.setter
    def recompute(self, selective: bool) -> None:
        self.experts.recompute = selective
        if "shared_experts" in self._modules:
            self.shared_experts.recompute = selective

    # ---- forward ----------------------------------------------------------------------------
    def forward(self, x):
        """x [B, T, C] (this rank's part of the sequences under SP / CP) -> [B, T, C]."""
        B, T, C = x.shape
        N, E, k = B * T, self.num_experts, self.top_k
        flat = x.reshape(N, C)
        logits = R.router_logits(flat, self.gate.weight)  # [N, E] float32
        scores = R.scores_of(logits, self.score_function)
        ids, weights = R.top_k_routing(scores, k, self.norm_topk_prob, self.selection_bias)
        ids_host = ids.cpu().numpy().reshape(B, T, k)
        keep = None
        if self.capacity_factor is not None:
            cap = R.capacity(self.capacity_factor, T, k, E)
            keep = from_numpy(R.capacity_keep(ids_host, E, cap).reshape(N, k)).to(device=x.device)
        order = sort_by_expert(ids, E, keep)
        xs = permute(flat, order.rows)
        counts = order.counts
        if self.ep is not None:
            xs, counts, handle = self.ep.dispatch(xs, order.counts)
        h = self.experts(xs, counts)
        if self.ep is not None:
            h = self.ep.combine(h, handle)
        y = unpermute(h, order.rows, index_select(weights.reshape(-1), 0, order.slots), N).reshape(B, T, C)
        if "shared_experts" in self._modules:
            y = y + self.shared_experts(x)
        return self._losses(y, logits.reshape(B, T, E), scores.reshape(B, T, E), ids_host, keep)

    def _losses(self, y, logits, scores, ids_host, keep):
        """Records the step's loads and loss values; attaches the auxiliary losses to y."""
        if not self.training:
            return y
        T = logits.shape[1] * self.split  # the whole sequences' length
        counts = R.counts_per_sequence(ids_host, self.num_experts)  # [B, E] this rank's part
        if self.split > 1 and self.aux_loss_coeff > 0:
            counts = self._sum_over_sequence(counts)
        aux = None
        if self.aux_loss_coeff > 0:
            lb = R.load_balancing_loss(scores, counts, self.top_k, T, self.score_function)
            aux = lb * self.aux_loss_coeff
        if self.z_loss_coeff > 0:
            z = R.z_loss(logits, T)
            aux = z * self.z_loss_coeff if aux is None else aux + z * self.z_loss_coeff
        if not is_recomputing():  # a full-recomputation rerun was counted by the first run
            self._load += np.bincount(ids_host.reshape(-1), minlength=self.num_experts)
            if keep is not None:
                self._dropped += int(keep.numel() - keep.sum().item())
            if self.aux_loss_coeff > 0:
                self._aux.append(lb.detach())
            if self.z_loss_coeff > 0:
                self._z.append(z.detach())
            self._calls += 1.0 / self.split
        if aux is None or not is_grad_enabled():
            return y
        # under CP the data-parallel average divides a sequence's gradient by CP as well: the
        # language-model loss multiplies by CP for the same reason (context_parallel.loss)
        return attach_aux_loss(y, aux, self.cp.size if self.cp is not None else 1)

    def _sum_over_sequence(self, values: np.ndarray) -> np.ndarray:
        """Sums a host array over the ranks a sequence is split over (TP under SP, CP)."""
        from ..parallel.process_group import sum_host_array
        return sum_host_array(values, [self.tp.group if self.tp is not None else None,
                                       self.cp.group if self.cp is not None else None], self.gate.weight.device)

    # ---- the step's record and the bias-based balancing ---------------------------------------
    def reset_step_record(self) -> None:
        self._load = np.zeros(self.num_experts, dtype=np.int64)
        self._aux, self._z, self._calls, self._dropped = [], [], 0.0, 0

    def step_record(self) -> np.ndarray:
        """This rank's record since the last reset, one array to be summed over ranks: [E loads,
        the load-balancing loss's parts, the z-loss's parts, the forward calls' weights,
        dropped assignments]. Summed over TP under SP here (its ranks route distinct tokens)."""
        lb = float(sum(t.item() for t in self._aux))
        z = float(sum(t.item() for t in self._z))
        record = np.concatenate([self._load.astype(np.float64), [lb, z, self._calls, float(self._dropped)]])
        if self.tp is not None:
            from ..parallel.process_group import sum_host_array
            record = sum_host_array(record, [self.tp.group], self.gate.weight.device)
        return record

    def update_bias(self, load: np.ndarray) -> None:
        """DeepSeek-V3's balancing: bias_e += rate * sign(mean load - load_e), from the loads of
        the step's whole batch (the same on every rank, so the biases stay equal)."""
        bias = self.selection_bias
        if bias is None:
            return
        step = self.bias_update_rate * np.sign(load.mean() - load)
        bias.copy_(bias + from_numpy(step.astype(np.float32)).to(device=bias.device, dtype=bias.dtype))
