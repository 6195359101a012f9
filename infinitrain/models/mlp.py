"""A multilayer perceptron classifier (MNIST)."""
from __future__ import annotations

from ..nn import functional as F
from ..nn.module import Module
from ..nn.modules import Dropout, Linear, ModuleList


class MLP(Module):
    def __init__(self, in_features: int = 784, hidden=(512, 256), classes: int = 10, dropout: float = 0.0):
        super().__init__()
        sizes = [in_features, *hidden, classes]
        self.layers = ModuleList(Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.dropout = Dropout(dropout)

    def forward(self, x):
        x = x.reshape(x.shape[0], -1)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.dropout(F.relu(x))
        return x
