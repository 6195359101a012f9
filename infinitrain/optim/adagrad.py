"""Adagrad (torch.optim.Adagrad): the gradient divided by the root of the sum of all past
squared gradients, the rate decayed by lr_decay per step; state in float32."""
from __future__ import annotations

from .adadelta import check_flags
from .adam import _number
from .optimizer import Optimizer


class Adagrad(Optimizer):
    state_spec = {"step": "int", "sum": "tensor"}

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0, weight_decay: float = 0,
                 initial_accumulator_value: float = 0, eps: float = 1e-10, foreach: bool | None = None, *,
                 maximize: bool = False, differentiable: bool = False, fused: bool | None = None):
        check_flags("Adagrad", False, differentiable)
        if fused:
            raise NotImplementedError("Adagrad: fused=True is not implemented; leave it None")
        group = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                     initial_accumulator_value=initial_accumulator_value, foreach=foreach, maximize=maximize,
                     differentiable=differentiable, fused=fused)
        self.check_hyperparameters(group)
        super().__init__(params, group)

    @classmethod
    def check_hyperparameters(cls, group: dict) -> None:
        values = {k: group.get(k) for k in ("lr", "lr_decay", "eps", "weight_decay", "initial_accumulator_value")}
        if not all(_number(v) and v >= 0 for v in values.values()):
            raise ValueError("Adagrad: " + ", ".join(f"{k} ({v!r})" for k, v in values.items())
                             + " must be finite numbers >= 0")

    def update(self, param, grad, state: dict, group: dict, first: bool) -> None:
        g = grad.float()
        g = -g if group["maximize"] else g
        if group["weight_decay"]:
            g = g + param.float() * group["weight_decay"]
        total = state["sum"]
        start = self.defaults["initial_accumulator_value"]  # PyTorch's: the constructor's, not the group's
        if first and start:
            total.fill_(start)
        total.copy_(total + g * g)
        rate = group["lr"] / (1 + (state["step"] - 1) * group["lr_decay"])
        param.copy_(param.float() - g / (total.sqrt() + group["eps"]) * rate)
