"""BatchNorm1d/2d and GroupNorm (torch.nn's names, arguments, buffers and state_dict keys)."""
from __future__ import annotations

from .. import creation
from .. import dtypes as _dt
from ..autograd import no_grad
from . import functional as F
from .module import Module
from .parameter import Parameter


class _BatchNorm(Module):
    _input_dims = (4,)

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None, *, bias: bool = True):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(creation.ones(num_features, dtype=dtype, device=device)) if affine else None
        self.bias = Parameter(creation.zeros(num_features, dtype=dtype, device=device)) if affine and bias else None
        if track_running_stats:
            self.register_buffer("running_mean", creation.zeros(num_features, dtype=dtype, device=device))
            self.register_buffer("running_var", creation.ones(num_features, dtype=dtype, device=device))
            self.register_buffer("num_batches_tracked", creation.zeros((), dtype=_dt.int64, device=device))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            with no_grad():
                self.running_mean.fill_(0)
                self.running_var.fill_(1)
                self.num_batches_tracked.fill_(0)

    def forward(self, x):
        if x.ndim not in self._input_dims:
            wanted = " or ".join(f"{d}D" for d in self._input_dims)
            raise ValueError(f"{type(self).__name__}: expected {wanted} input (got {x.ndim}D input)")
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            with no_grad():
                self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative moving average
                momentum = 1.0 / float(self.num_batches_tracked.item())
        use_batch_stats = self.training or self.running_mean is None
        track = not self.training or self.track_running_stats
        return F.batch_norm(x, self.running_mean if track else None, self.running_var if track else None,
                            self.weight, self.bias, use_batch_stats, momentum, self.eps)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    _input_dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    _input_dims = (4,)


class GroupNorm(Module):
    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, device=None,
                 dtype=None, *, bias: bool = True):
        super().__init__()
        if num_channels % num_groups:
            raise ValueError("num_channels must be divisible by num_groups")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        self.weight = Parameter(creation.ones(num_channels, dtype=dtype, device=device)) if affine else None
        self.bias = Parameter(creation.zeros(num_channels, dtype=dtype, device=device)) if affine and bias else None

    def forward(self, x):
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"
