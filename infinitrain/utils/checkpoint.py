"""torch.utils.checkpoint at its path, over infinitrain's activation recomputation
(autograd.recompute): a piece of the model keeps only its inputs and runs again inside
backward, and its gradients are those of a run without checkpointing. Both of PyTorch's
variants (use_reentrant True or False) run this one recomputation; random numbers drawn in
the piece are always replayed (preserve_rng_state=False is accepted and saves nothing)."""
from __future__ import annotations

from ..autograd.recompute import checkpoint as _recompute
from ..tensor import Tensor

__all__ = ["checkpoint", "checkpoint_sequential"]


class _Piece:
    """A callable for the recomputation: `fn`, its keyword arguments bound, and the trainable
    parameters of the modules it runs (so that their gradients leave through the piece)."""

    def __init__(self, fns, kwargs=None):
        self.fns, self.kwargs = list(fns), kwargs or {}

    def __call__(self, *args):
        if len(self.fns) == 1:
            return self.fns[0](*args, **self.kwargs)
        x, = args
        for f in self.fns:
            x = f(x)
        return x

    def parameters(self):
        seen = set()
        for f in self.fns:
            owner = getattr(f, "__self__", f)  # a bound method's module
            found = getattr(owner, "parameters", None)
            for p in found() if callable(found) else ():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p


def checkpoint(function, *args, use_reentrant: bool | None = None, context_fn=None, determinism_check: str = "default",
               debug: bool = False, early_stop: bool = True, **kwargs):
    """function(*args, **kwargs) without keeping its activations for backward: they are
    recomputed there. Keyword arguments reach `function` with use_reentrant=False, as in
    PyTorch; tensors that need gradients must be passed positionally."""
    preserve_rng_state = kwargs.pop("preserve_rng_state", True)
    if not isinstance(preserve_rng_state, bool):
        raise TypeError(f"checkpoint: preserve_rng_state must be a bool, got {preserve_rng_state!r}")
    if use_reentrant is not False and kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    if context_fn is not None:
        raise NotImplementedError("checkpoint: context_fn is not supported by infinitrain's recomputation")
    if determinism_check not in ("default", "none"):
        raise ValueError(f"determinism_check should be one of ['default', 'none'], but got {determinism_check}")
    for name, value in kwargs.items():
        if isinstance(value, Tensor) and value.requires_grad:
            raise ValueError(f"checkpoint: keyword argument {name!r} needs a gradient; pass it positionally "
                             "(only positional tensors get gradients through the recomputation)")
    return _recompute(_Piece([function], kwargs), *args)


def checkpoint_sequential(functions, segments: int, input, use_reentrant: bool | None = None, **kwargs):
    """Runs `functions` (an nn.Sequential or a list of modules/functions) on `input` in
    `segments` pieces, each but the last checkpointed."""
    preserve_rng_state = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    children = getattr(functions, "children", None)
    fns = list(children()) if callable(children) else list(functions)
    if not isinstance(segments, int) or segments < 1:
        raise ValueError(f"checkpoint_sequential: segments must be a positive int, got {segments!r}")
    size = len(fns) // segments
    end = 0
    for start in range(0, size * (segments - 1), size):
        end = start + size
        input = checkpoint(_Piece(fns[start:end]), input, use_reentrant=use_reentrant,
                           preserve_rng_state=preserve_rng_state)
    for f in fns[end:]:
        input = f(input)
    return input
