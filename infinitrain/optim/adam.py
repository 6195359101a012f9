"""Adam and AdamW (decoupled weight decay) with the fused native update; moments in float32.
Adam's L2-style weight decay is folded into the gradient first, as torch.optim.Adam does."""
from __future__ import annotations

import math

from ..kernels import optim as kopt
from .optimizer import Optimizer


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class AdamW(Optimizer):
    state_spec = {"step": "int", "exp_avg": "tensor", "exp_avg_sq": "tensor"}

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        self.check_hyperparameters(dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @classmethod
    def check_hyperparameters(cls, group: dict) -> None:
        lr, betas, eps, wd = (group.get(k) for k in ("lr", "betas", "eps", "weight_decay"))
        if not all(_number(v) and v >= 0 for v in (lr, eps, wd)):
            raise ValueError(f"{cls.__name__}: lr ({lr!r}), eps ({eps!r}) and weight_decay ({wd!r}) must be "
                             "finite numbers >= 0")
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2 and all(_number(b) and 0 <= b < 1 for b in betas)):
            raise ValueError(f"{cls.__name__}: betas must be two numbers in [0, 1), got {betas!r}")

    def update(self, param, grad, state: dict, group: dict, first: bool) -> None:
        b1, b2 = group["betas"]
        kopt.adamw_step(param, self._grad(param, grad, group), state["exp_avg"], state["exp_avg_sq"],
                        lr=group["lr"], beta1=b1, beta2=b2, eps=group["eps"],
                        weight_decay=self._decoupled_decay(group), step=state["step"])

    def update_group(self, updates: list, group: dict) -> None:
        """The parameters that share a device, a dtype and a step count in one multi-tensor
        update (a GPU launch instead of one per parameter), each with update's bits."""
        buckets = {}
        for param, grad, state, _first in updates:
            if param.is_contiguous():
                buckets.setdefault((param.device, param.dtype, state["step"]), []).append((param, grad, state))
            else:
                self.update(param, grad, state, group, _first)  # refused there, with update's message
        b1, b2 = group["betas"]
        for (_device, _dtype, step), bucket in buckets.items():
            kopt.adamw_step_multi([p for p, _, _ in bucket], [self._grad(p, g, group) for p, g, _ in bucket],
                                  [s["exp_avg"] for _, _, s in bucket], [s["exp_avg_sq"] for _, _, s in bucket],
                                  lr=group["lr"], beta1=b1, beta2=b2, eps=group["eps"],
                                  weight_decay=self._decoupled_decay(group), step=step)

    def _grad(self, param, grad, group):
        return grad

    def _decoupled_decay(self, group) -> float:
        return group["weight_decay"]


class Adam(AdamW):
    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(params, lr, betas, eps, weight_decay)

    def _grad(self, param, grad, group):
        wd = group["weight_decay"]
        return grad if wd == 0 else grad + param.detach() * wd

    def _decoupled_decay(self, group) -> float:
        return 0.0
