"""Size: a tensor's shape, a tuple of ints as torch.Size (slicing and adding keep it a Size)."""
from __future__ import annotations

import math


class Size(tuple):
    __slots__ = ()

    def numel(self) -> int:
        return math.prod(self)

    def __getitem__(self, key):
        out = tuple.__getitem__(self, key)
        return Size(out) if isinstance(key, slice) else out

    def __add__(self, other):
        return Size(tuple.__add__(self, tuple(other))) if isinstance(other, tuple) else NotImplemented

    def __radd__(self, other):
        return Size(tuple(other) + tuple(self)) if isinstance(other, tuple) else NotImplemented

    def __repr__(self) -> str:
        return f"infinitrain.Size({list(self)})"

    __str__ = __repr__

    def __reduce__(self):
        return (Size, (tuple(self),))
