"""What a trainer does with the MoE layers after each optimizer step: sum their records (loads
per expert, auxiliary-loss values) over the ranks, update DeepSeek-V3's selection biases from
the step's whole batch, and report the step's figures for the log."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class MoEStepStats:
    """tokens_per_expert: layer index -> assignments per expert over the step's batch (every
    rank's); aux_loss / z_loss: the layers' mean load-balancing / z loss (coefficients not
    applied), None when that loss is off; dropped: layer index -> assignments the capacity dropped."""
    tokens_per_expert: dict
    aux_loss: float | None
    z_loss: float | None
    dropped: dict

    @property
    def imbalance(self) -> float:
        """The most loaded expert's tokens over the mean, in the worst layer (1.0: balanced)."""
        worst = [load.max() / load.mean() for load in self.tokens_per_expert.values() if load.sum() > 0]
        return float(max(worst)) if worst else 1.0


def update_moe_biases(layers: dict, reduce=None) -> MoEStepStats:
    """layers: index -> MoE (this rank's). reduce: a callable that sums a host array over the
    data-parallel ranks (DP x CP: every rank with other tokens than this one's TP group), or
    None on one such rank. Updates the selection biases, clears the layers' records and
    returns the step's figures."""
    if not layers:
        return MoEStepStats({}, None, None, {})
    records = [layer.step_record() for layer in layers.values()]
    flat = np.concatenate(records)
    if reduce is not None:
        flat = np.asarray(reduce(flat), dtype=np.float64).reshape(flat.shape)
    loads, aux, z, dropped, at = {}, [], [], {}, 0
    for i, layer in layers.items():
        E = layer.num_experts
        rec = flat[at:at + E + 4]
        at += E + 4
        loads[i] = rec[:E].round().astype(np.int64)
        lb_sum, z_sum, calls, drops = rec[E:]
        if calls > 0:
            if layer.aux_loss_coeff > 0:
                aux.append(lb_sum / calls)
            if layer.z_loss_coeff > 0:
                z.append(z_sum / calls)
        dropped[i] = int(round(drops))
        layer.update_bias(loads[i].astype(np.float64))
        layer.reset_step_record()
    return MoEStepStats(loads, float(np.mean(aux)) if aux else None, float(np.mean(z)) if z else None, dropped)
