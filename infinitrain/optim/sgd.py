"""Stochastic gradient descent with momentum, as torch.optim.SGD (one fused native update)."""
from __future__ import annotations

import math

from ..kernels import optim as kopt
from .optimizer import Optimizer


class SGD(Optimizer):
    state_spec = {"momentum_buffer": "tensor"}  # (none at all without momentum)

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        self.check_hyperparameters(dict(lr=lr, momentum=momentum, dampening=dampening,
                                        weight_decay=weight_decay, nesterov=nesterov))
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov))

    @classmethod
    def check_hyperparameters(cls, group: dict) -> None:
        lr, momentum, dampening, wd, nesterov = (group.get(k) for k in
                                                 ("lr", "momentum", "dampening", "weight_decay", "nesterov"))
        numbers = (lr, momentum, dampening, wd)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                   for v in numbers):
            raise ValueError(f"SGD: lr ({lr!r}), momentum ({momentum!r}), dampening ({dampening!r}) and "
                             f"weight_decay ({wd!r}) must be finite numbers >= 0")
        if not isinstance(nesterov, bool):
            raise ValueError(f"SGD: nesterov must be True or False, got {nesterov!r}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum needs momentum > 0 and zero dampening")

    def tensor_keys(self, group: dict) -> tuple:
        return ("momentum_buffer",) if group["momentum"] != 0 else ()

    def update(self, param, grad, state: dict, group: dict, first: bool) -> None:
        kopt.sgd_step(param, grad, state.get("momentum_buffer"), lr=group["lr"], momentum=group["momentum"],
                      dampening=group["dampening"], weight_decay=group["weight_decay"],
                      nesterov=group["nesterov"], first_step=first)
