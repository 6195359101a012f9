"""Adadelta (torch.optim.Adadelta): a step sized by the ratio of running RMS of past updates
to running RMS of gradients, its state float32 whatever the parameter's dtype."""
from __future__ import annotations

from .adam import _number
from .optimizer import Optimizer


def check_flags(cls_name: str, capturable: bool, differentiable: bool) -> None:
    """capturable (CUDA graphs) and differentiable (autograd through the step) are refused."""
    if capturable or differentiable:
        raise NotImplementedError(f"{cls_name}: capturable=True and differentiable=True are not implemented; "
                                  "leave them False")


class Adadelta(Optimizer):
    state_spec = {"step": "int", "square_avg": "tensor", "acc_delta": "tensor"}

    def __init__(self, params, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6, weight_decay: float = 0,
                 foreach: bool | None = None, *, capturable: bool = False, maximize: bool = False,
                 differentiable: bool = False):
        check_flags("Adadelta", capturable, differentiable)
        group = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, foreach=foreach, maximize=maximize,
                     capturable=capturable, differentiable=differentiable)
        self.check_hyperparameters(group)
        super().__init__(params, group)

    @classmethod
    def check_hyperparameters(cls, group: dict) -> None:
        lr, rho, eps, wd = (group.get(k) for k in ("lr", "rho", "eps", "weight_decay"))
        if not all(_number(v) and v >= 0 for v in (lr, eps, wd)) or not (_number(rho) and 0 <= rho <= 1):
            raise ValueError(f"Adadelta: lr ({lr!r}), eps ({eps!r}) and weight_decay ({wd!r}) must be finite "
                             f"numbers >= 0 and rho ({rho!r}) in [0, 1]")

    def update(self, param, grad, state: dict, group: dict, first: bool) -> None:
        g = grad.float()
        g = -g if group["maximize"] else g
        if group["weight_decay"]:
            g = g + param.float() * group["weight_decay"]
        rho, eps = group["rho"], group["eps"]
        square_avg, acc_delta = state["square_avg"], state["acc_delta"]
        square_avg.copy_(square_avg * rho + g * g * (1 - rho))
        delta = (acc_delta + eps).sqrt() / (square_avg + eps).sqrt() * g
        acc_delta.copy_(acc_delta * rho + delta * delta * (1 - rho))
        param.copy_(param.float() - delta * group["lr"])
