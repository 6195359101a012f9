"""Mixture-of-experts layers: the router (router.py), the experts (experts.py), the layer
(layer.py), the auxiliary losses' way into the gradients (aux_loss.py) and the step's
balancing (balance.py)."""
from .aux_loss import MoEAuxLossAutoScaler, aux_loss_scale
from .balance import MoEStepStats, update_moe_biases
from .experts import Expert, Experts, SharedExperts
from .layer import MoE

__all__ = ["MoE", "Expert", "Experts", "SharedExperts", "MoEAuxLossAutoScaler", "aux_loss_scale",
           "MoEStepStats", "update_moe_biases"]
