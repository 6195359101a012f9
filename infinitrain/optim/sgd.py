"""Stochastic gradient descent with momentum, as torch.optim.SGD (one fused native update)."""
from __future__ import annotations

from ..autograd import no_grad
from ..creation import zeros
from ..kernels import optim as kopt
from .optimizer import Optimizer


class SGD(Optimizer):
    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD: lr ({lr}), momentum ({momentum}) and weight_decay "
                             f"({weight_decay}) must be >= 0")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum needs momentum > 0 and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov))

    @no_grad()
    def step(self) -> None:
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                state = self.state.setdefault(p, {})
                buf = None
                first = False
                if g["momentum"] != 0:
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = state["momentum_buffer"] = zeros(*p.shape, device=p.device)
                        first = True
                kopt.sgd_step(p, p.grad, buf, lr=g["lr"], momentum=g["momentum"],
                              dampening=g["dampening"], weight_decay=g["weight_decay"],
                              nesterov=g["nesterov"], first_step=first)
