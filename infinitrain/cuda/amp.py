"""torch.cuda.amp, PyTorch's older spelling of torch.amp for CUDA: autocast(enabled, dtype,
cache_enabled) with float16 by default, and GradScaler(init_scale, ...) for "cuda". Both are
torch.amp's with the device named for them (PyTorch deprecates this module, and still runs it)."""
from __future__ import annotations

from ..amp import autocast as _autocast
from ..dtypes import float16
from ..optim.grad_scaler import GradScaler as _GradScaler


class autocast(_autocast):
    def __init__(self, enabled: bool = True, dtype=float16, cache_enabled: bool = True):
        super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class GradScaler(_GradScaler):
    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True):
        super().__init__("cuda", init_scale, growth_factor, backoff_factor, growth_interval, enabled)
