"""RMSprop (torch.optim.RMSprop): the gradient divided by a running RMS of gradients (centered:
of their deviation from a running mean), with optional momentum; state in float32."""
from __future__ import annotations

from .adadelta import check_flags
from .adam import _number
from .optimizer import Optimizer


class RMSprop(Optimizer):
    state_spec = {"step": "int", "square_avg": "tensor", "momentum_buffer": "tensor", "grad_avg": "tensor"}
    optional_state = ("momentum_buffer", "grad_avg")  # kept with momentum > 0, and when centered

    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0,
                 momentum: float = 0, centered: bool = False, capturable: bool = False,
                 foreach: bool | None = None, maximize: bool = False, differentiable: bool = False):
        check_flags("RMSprop", capturable, differentiable)
        group = dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum, centered=centered,
                     capturable=capturable, foreach=foreach, maximize=maximize, differentiable=differentiable)
        self.check_hyperparameters(group)
        super().__init__(params, group)

    @classmethod
    def check_hyperparameters(cls, group: dict) -> None:
        lr, alpha, eps, wd, momentum = (group.get(k) for k in ("lr", "alpha", "eps", "weight_decay", "momentum"))
        if not all(_number(v) and v >= 0 for v in (lr, alpha, eps, wd, momentum)):
            raise ValueError(f"RMSprop: lr ({lr!r}), alpha ({alpha!r}), eps ({eps!r}), weight_decay ({wd!r}) "
                             f"and momentum ({momentum!r}) must be finite numbers >= 0")

    def tensor_keys(self, group: dict) -> tuple:
        return ("square_avg",) + (("momentum_buffer",) if group["momentum"] > 0 else ()) \
            + (("grad_avg",) if group["centered"] else ())

    def update(self, param, grad, state: dict, group: dict, first: bool) -> None:
        g = grad.float()
        g = -g if group["maximize"] else g
        if group["weight_decay"]:
            g = g + param.float() * group["weight_decay"]
        alpha, square_avg = group["alpha"], state["square_avg"]
        square_avg.copy_(square_avg * alpha + g * g * (1 - alpha))
        if group["centered"]:
            grad_avg = state["grad_avg"]
            grad_avg.copy_(grad_avg + (g - grad_avg) * (1 - alpha))
            avg = (square_avg - grad_avg * grad_avg).sqrt() + group["eps"]
        else:
            avg = square_avg.sqrt() + group["eps"]
        step = g / avg
        if group["momentum"] > 0:
            buf = state["momentum_buffer"]
            buf.copy_(buf * group["momentum"] + step)
            step = buf
        param.copy_(param.float() - step * group["lr"])
