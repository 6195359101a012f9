"""torch.accelerator: the machine's accelerator, CUDA here when a GPU is usable."""
from __future__ import annotations

from . import cuda as _cuda
from .device import device


def is_available() -> bool:
    return _cuda.is_available()


def device_count() -> int:
    return _cuda.device_count()


def current_accelerator(check_available: bool = False):
    """device('cuda') when a CUDA GPU is usable, else None (as PyTorch on a machine without one)."""
    return device("cuda") if _cuda.is_available() else None


def current_device_index() -> int:
    return _cuda.current_device()


def synchronize(device=None) -> None:
    _cuda.synchronize(device)
