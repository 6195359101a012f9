"""Adam and AdamW (decoupled weight decay) with the fused native update; moments in float32.
Adam's L2-style weight decay is folded into the gradient first, as torch.optim.Adam does."""
from __future__ import annotations

from ..autograd import no_grad
from ..creation import zeros
from ..kernels import optim as kopt
from .optimizer import Optimizer


class AdamW(Optimizer):
    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"{type(self).__name__}: lr ({lr}), eps ({eps}) and weight_decay "
                             f"({weight_decay}) must be >= 0")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"{type(self).__name__}: betas must be in [0, 1), got {betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    def _grad(self, p, group):
        return p.grad

    def _decoupled_decay(self, group) -> float:
        return group["weight_decay"]

    @no_grad()
    def step(self) -> None:
        for g in self.param_groups:
            b1, b2 = g["betas"]
            for p in g["params"]:
                if p.grad is None:
                    continue
                state = self.state.setdefault(p, {})
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = zeros(*p.shape, device=p.device)
                    state["exp_avg_sq"] = zeros(*p.shape, device=p.device)
                state["step"] += 1
                kopt.adamw_step(p, self._grad(p, g), state["exp_avg"], state["exp_avg_sq"],
                                lr=g["lr"], beta1=b1, beta2=b2, eps=g["eps"],
                                weight_decay=self._decoupled_decay(g), step=state["step"])


class Adam(AdamW):
    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(params, lr, betas, eps, weight_decay)

    def _grad(self, p, group):
        wd = group["weight_decay"]
        return p.grad if wd == 0 else p.grad + p.detach() * wd

    def _decoupled_decay(self, group) -> float:
        return 0.0
