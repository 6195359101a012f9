"""Tensor methods that concern autograd: `_tracks` (whether an operation on the tensor must be
recorded, what the views and conversions ask), `backward`, `retain_grad`."""
from __future__ import annotations

from ..autograd.grad_mode import is_grad_enabled


class GradMethods:
    def _tracks(self) -> bool:
        """Whether an operation on this tensor must be recorded for autograd."""
        return self.requires_grad and is_grad_enabled()

    def backward(self, gradient=None, retain_graph: bool = False) -> None:
        from ..autograd import backward
        backward(self, gradient, retain_graph=retain_graph)

    def retain_grad(self):
        """Keeps this non-leaf tensor's gradient in .grad after backward (a leaf keeps its own)."""
        if self.is_leaf or not self.requires_grad:
            return

        def keep(g):
            self.grad = g if self.grad is None else self.grad + g
        self.register_hook(keep)
