"""Argument checks shared by the kernel bindings."""
from __future__ import annotations

from .. import dtypes as _dt


def same_device(op: str, **tensors) -> None:
    items = [(n, t) for n, t in tensors.items() if t is not None]
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise ValueError(f"{op}: {first_name} is on {first.device} but {name} is on "
                             f"{t.device}; move them to one device first")


def same_dtype(op: str, **tensors) -> None:
    items = [(n, t) for n, t in tensors.items() if t is not None]
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.dtype is not first.dtype:
            raise TypeError(f"{op}: {first_name} is {first.dtype.name} but {name} is "
                            f"{t.dtype.name}; convert one with .to(dtype)")


def floating(op: str, name: str, t) -> None:
    if not t.dtype.is_floating_point:
        raise TypeError(f"{op}: {name} must be a floating-point tensor, got {t.dtype.name}")


def index_tensor(op: str, name: str, t) -> None:
    if t.dtype not in (_dt.int32, _dt.int64):
        raise TypeError(f"{op}: {name} must be int32 or int64, got {t.dtype.name}")


def shape_is(op: str, name: str, t, shape: tuple) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
