"""Layers and containers: Linear, Embedding, LayerNorm, RMSNorm, Dropout, activations,
CrossEntropyLoss, Sequential, ModuleList, ModuleDict."""
from __future__ import annotations

from collections import OrderedDict

from .. import creation
from ..autograd import no_grad
from . import functional as F
from . import init
from .module import Module
from .parameter import Parameter


class Linear(Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(creation.empty(out_features, in_features, dtype=dtype, device=device))
        self.bias = Parameter(creation.empty(out_features, dtype=dtype, device=device)) if bias else None
        init.kaiming_uniform_linear_(self.weight)
        if self.bias is not None:
            init.uniform_(self.bias, -(in_features ** -0.5), in_features ** -0.5)

    lora_on = False  # nn.lora.apply_lora adds lora_A, lora_B and turns this on

    def forward(self, x):
        y = F.linear(x, self.weight, self.bias)
        return y + F.lora(x, self.lora_A, self.lora_B, self.lora_scale) if self.lora_on else y

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, device=None,
                 dtype=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        if padding_idx is not None and not -num_embeddings <= padding_idx < num_embeddings:
            raise ValueError(f"Embedding: padding_idx {padding_idx} is not a row of {num_embeddings}")
        self.padding_idx = None if padding_idx is None else padding_idx % num_embeddings
        self.weight = Parameter(creation.empty(num_embeddings, embedding_dim, dtype=dtype, device=device))
        init.normal_(self.weight)
        if self.padding_idx is not None:  # PyTorch's: the padding row starts at zero
            with no_grad():
                self.weight[self.padding_idx] = 0.0

    def forward(self, indices):
        return F.embedding(indices, self.weight, self.padding_idx)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}"


class LayerNorm(Module):
    def __init__(self, normalized_shape: int, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape, self.eps = normalized_shape, eps
        self.weight = Parameter(creation.ones(normalized_shape, dtype=dtype, device=device)) \
            if elementwise_affine else None
        self.bias = Parameter(creation.zeros(normalized_shape, dtype=dtype, device=device)) \
            if elementwise_affine and bias else None

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}"


class RMSNorm(Module):
    def __init__(self, normalized_shape: int, eps: float = 1e-6, elementwise_affine: bool = True, device=None,
                 dtype=None):
        super().__init__()
        self.normalized_shape, self.eps = normalized_shape, eps
        self.weight = Parameter(creation.ones(normalized_shape, dtype=dtype, device=device)) \
            if elementwise_affine else None

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}"


class Identity(Module):
    """Returns its input (a placeholder layer, as torch.nn.Identity)."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


class Dropout(Module):
    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    generator = None  # the default one; tensor parallelism gives each rank's split activations a fork

    def forward(self, x):
        return F.dropout(x, self.p, self.training, generator=self.generator)

    def extra_repr(self):
        return f"p={self.p}"


class GELU(Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)


class SiLU(Module):
    def forward(self, x):
        return F.silu(x)


class ReLU(Module):
    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, x):
        return F.relu(x, inplace=self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class Sigmoid(Module):
    def forward(self, x):
        return F.sigmoid(x)


class Tanh(Module):
    def forward(self, x):
        return F.tanh(x)


class Softmax(Module):
    def __init__(self, dim: int | None = None):
        super().__init__()
        if dim is None:
            raise ValueError("Softmax: give dim (PyTorch's implicit choice of dimension is deprecated)")
        self.dim = dim

    def forward(self, x):
        return F.softmax(x, self.dim)


class MSELoss(Module):
    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, input, target):
        return F.mse_loss(input, target, self.reduction)


class CrossEntropyLoss(Module):
    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0):
        super().__init__()
        self.ignore_index, self.reduction, self.label_smoothing = ignore_index, reduction, label_smoothing

    def forward(self, input, target):
        return F.cross_entropy(input, target, self.ignore_index, self.reduction, self.label_smoothing)


class Sequential(Module):
    def __init__(self, *modules):
        super().__init__()
        items = modules[0].items() if len(modules) == 1 and isinstance(modules[0], (dict, OrderedDict)) \
            else ((str(i), m) for i, m in enumerate(modules))
        for name, m in items:
            self.add_module(name, m)

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class ModuleList(Module):
    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module: Module) -> "ModuleList":
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules) -> "ModuleList":
        for m in modules:
            self.append(m)
        return self

    def __getitem__(self, i):
        mods = list(self._modules.values())
        return ModuleList(mods[i]) if isinstance(i, slice) else mods[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class ModuleDict(Module):
    def __init__(self, modules=None):
        super().__init__()
        for name, m in (modules or {}).items():
            self.add_module(name, m)

    def __getitem__(self, name):
        return self._modules[name]

    def __setitem__(self, name, module):
        self.add_module(name, module)

    def __contains__(self, name):
        return name in self._modules

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()
