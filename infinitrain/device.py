"""Devices, named as in PyTorch: 'cpu', 'cuda', 'cuda:1'."""
from __future__ import annotations

from ._native import ffi, lib


class device:
    __slots__ = ("type", "index", "_native")

    def __init__(self, spec="cpu", index: int | None = None):
        if isinstance(spec, device):
            spec, index = spec.type, spec.index
        if not isinstance(spec, str):
            raise TypeError(f"device must be a string like 'cpu' or 'cuda:0', got {spec!r}")
        kind, _, idx = spec.partition(":")
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"unknown device type {kind!r} in {spec!r}; expected 'cpu' or 'cuda[:N]'")
        if idx:
            if not idx.isdigit():
                raise ValueError(f"bad device index in {spec!r}")
            index = int(idx)
        self.type = kind
        self.index = 0 if index is None else int(index)
        self._native = ffi.new("it_device *", [lib.IT_CPU if kind == "cpu" else lib.IT_CUDA,
                                                self.index])

    @property
    def native(self):
        return self._native[0]

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            other = device(other)
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __repr__(self) -> str:
        return f"device(type='{self.type}', index={self.index})" if self.type == "cuda" \
            else "device(type='cpu')"

    def __str__(self) -> str:
        return self.type if self.type == "cpu" else f"cuda:{self.index}"


CPU = device("cpu")


def as_device(value) -> device:
    return value if isinstance(value, device) else device(value if value is not None else "cpu")
