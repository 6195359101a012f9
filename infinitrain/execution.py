"""How a PyTorch program asks its code to be run: torch.compile (here the model itself, with a
one-time note), inference_mode, use_deterministic_algorithms."""
from __future__ import annotations

import functools
import threading
import warnings

from .autograd import is_grad_enabled, set_grad_enabled

_compile_noted = [False]


def compile(model=None, *, fullgraph: bool = False, dynamic=None, backend="inductor", mode=None,  # noqa: A001
            options=None, disable: bool = False, **kwargs):
    """torch.compile's signature, returning the model or function unchanged: infinitrain runs
    eagerly (its fused kernels are chosen when the model is built), so there is nothing to
    compile. Usable as compile(model), @compile and @compile(mode=...)."""
    if model is None:
        return functools.partial(compile, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
                                 options=options, disable=disable, **kwargs)
    if not callable(model):
        raise TypeError(f"compile() expects a module or a function, got {type(model).__name__}")
    if not disable and not _compile_noted[0]:
        _compile_noted[0] = True
        warnings.warn("infinitrain.compile() returns the model unchanged: infinitrain runs eagerly with its own "
                      "fused kernels", UserWarning, stacklevel=2)
    return model


_inference = threading.local()  # per thread, as grad mode is


class inference_mode:
    """As no_grad (PyTorch's inference_mode also skips version counting, which infinitrain
    has no cost for): a context manager, @inference_mode() or @inference_mode. With mode=False
    it changes nothing."""

    def __new__(cls, mode=True):
        if callable(mode) and not isinstance(mode, bool):  # bare @inference_mode
            return cls(True)(mode)
        return super().__new__(cls)

    def __init__(self, mode: bool = True):
        self.mode = bool(mode)

    def __enter__(self):
        self._prev = (is_grad_enabled(), is_inference_mode_enabled())
        if self.mode:
            set_grad_enabled(False)
            _inference.on = True
        return self

    def __exit__(self, *exc):
        set_grad_enabled(self._prev[0])
        _inference.on = self._prev[1]
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with inference_mode(self.mode):
                return fn(*args, **kwargs)
        return wrapper


def is_inference_mode_enabled() -> bool:
    return getattr(_inference, "on", False)


_deterministic = [False]


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """Accepted and recorded: infinitrain has no separate deterministic kernels to switch to."""
    _deterministic[0] = bool(mode)


def are_deterministic_algorithms_enabled() -> bool:
    return _deterministic[0]
