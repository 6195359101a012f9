"""no_grad / enable_grad: whether operations record the graph (per thread)."""
from __future__ import annotations

import functools
import threading

_state = threading.local()


def is_grad_enabled() -> bool:
    return getattr(_state, "enabled", True)


def set_grad_enabled(mode: bool) -> None:
    _state.enabled = bool(mode)


class _GradMode:
    mode = True

    def __enter__(self):
        self._prev = is_grad_enabled()
        set_grad_enabled(self.mode)
        return self

    def __exit__(self, *exc):
        set_grad_enabled(self._prev)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.__class__():
                return fn(*args, **kwargs)
        return wrapper


class no_grad(_GradMode):
    """Operations inside do not record the graph (inference, optimizer steps)."""
    mode = False


class enable_grad(_GradMode):
    mode = True
