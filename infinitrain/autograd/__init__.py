"""Reverse-mode automatic differentiation."""
from .engine import backward, defer_weight_grads, grad, run_deferred_weight_grads, zero_grads
from .function import Context, Function, Node
from .grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .recompute import checkpoint
from . import views  # noqa: F401  (re-basing of views written in place)

__all__ = ["Function", "Context", "Node", "backward", "grad", "no_grad", "enable_grad",
           "is_grad_enabled", "set_grad_enabled", "zero_grads", "checkpoint",
           "defer_weight_grads", "run_deferred_weight_grads"]
