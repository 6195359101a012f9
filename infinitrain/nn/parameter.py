"""Parameter: a Tensor that a Module registers as trainable."""
from __future__ import annotations

from ..tensor import Tensor


class Parameter(Tensor):
    # how the parameter is laid out over ranks (nn.parallel.tensor_parallel): `tp_shard` when it
    # is one block of a larger tensor, `partial_grad_group` when its gradient must be
    # summed over that group after backward (SP's replicated parameters, LoRA's whole halves);
    # `tied_copy_of` (a name) when it is a pipeline stage's copy of a parameter that one process
    # ties (GPT-2's output head on the last stage copies the token embedding); `expert_parallel`
    # (True) when it is an expert's under expert parallelism (each EP rank holds other experts:
    # its gradient is reduced over the ranks holding the same ones); unset for an ordinary parameter
    __slots__ = ("tp_shard", "partial_grad_group", "tied_copy_of", "expert_parallel")

    def __new__(cls, data: Tensor, requires_grad: bool = True):
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter(data) needs a Tensor, got {type(data).__name__}")
        p = cls._make(data._storage, data.shape, data.stride(), data._offset, data.dtype)
        p.requires_grad = requires_grad
        return p

    def __init__(self, data=None, requires_grad: bool = True):
        pass

    def _assign(self, t: Tensor) -> None:
        """Points this parameter at t's memory (dtype/device changes keep the same object, so
        optimizers and hooks that hold it stay valid)."""
        self._storage, self._shape, self._strides = t._storage, t.shape, t.stride()
        self._offset, self.dtype = t._offset, t.dtype

    def __deepcopy__(self, memo) -> "Parameter":
        out = Parameter(Tensor.__deepcopy__(self, memo), self.requires_grad)
        out.grad = memo[id(self)].grad
        for name in self.__slots__:  # the layout over ranks, where one was set
            try:
                setattr(out, name, object.__getattribute__(self, name))
            except AttributeError:
                pass
        memo[id(self)] = out
        return out

    def __getattr__(self, name):
        if name in Parameter.__slots__:
            return None
        raise AttributeError(f"'Parameter' object has no attribute {name!r}")

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()
