"""GradScaler (torch.amp.GradScaler): the loss scaled up before backward so that small
gradients survive 16-bit arithmetic, the gradients scaled back down before the optimizer
steps, a step with an inf or NaN gradient skipped and the scale backed off, and the scale
grown again after growth_interval clean steps. The scale is kept as PyTorch keeps it, a
float32 number (its products rounded as PyTorch's float32 scale tensor rounds them)."""
from __future__ import annotations

import warnings

import numpy as np

from .. import cuda
from .. import dtypes as _dt
from ..autograd import no_grad
from ..device import as_device
from ..ops.shape import stack
from ..tensor import Tensor

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


def _f32(x) -> float:
    return float(np.float32(x))


class GradScaler:
    def __init__(self, device: str = "cuda", init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True):
        self._device = as_device(device).type
        if enabled and self._device == "cuda" and not cuda.is_available():
            warnings.warn("GradScaler is enabled, but CUDA is not available. Disabling.")
            enabled = False
        self._enabled = enabled
        if enabled:
            if not growth_factor > 1.0:
                raise ValueError(f"GradScaler: growth_factor must be > 1, got {growth_factor}")
            if not 0.0 < backoff_factor < 1.0:
                raise ValueError(f"GradScaler: backoff_factor must be in (0, 1), got {backoff_factor}")
            if not (isinstance(growth_interval, int) and growth_interval > 0):
                raise ValueError(f"GradScaler: growth_interval must be a positive integer, got {growth_interval!r}")
        self._scale, self._growth_factor, self._backoff_factor = _f32(init_scale), growth_factor, backoff_factor
        self._growth_interval, self._growth_tracker = growth_interval, 0
        self._per_optimizer = {}  # id(optimizer) -> {"stage": ..., "found_inf": bool}

    def is_enabled(self) -> bool:
        return self._enabled

    def scale(self, outputs):
        """outputs (a tensor, or a list/tuple of them, nested) times the scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            return outputs * self._scale
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise ValueError(f"GradScaler.scale: outputs must be a tensor or an iterable of tensors, "
                         f"got {type(outputs).__name__}")

    def _state(self, optimizer) -> dict:
        return self._per_optimizer.setdefault(id(optimizer), {"stage": _READY, "found_inf": False})

    @no_grad()
    def unscale_(self, optimizer) -> None:
        """Divides optimizer's gradients by the scale in place and notes whether any is inf or
        NaN (then step skips). Once per optimizer between updates, before step."""
        if not self._enabled:
            return
        state = self._state(optimizer)
        if state["stage"] is _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inverse = _f32(1.0 / np.float64(self._scale))
        checks = []
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.dtype is _dt.float16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                p.grad.mul_(inverse)
                checks.append((p.grad.float() * 0.0).sum())  # NaN where any element is inf or NaN
        state["found_inf"] = bool(checks) and not np.isfinite(stack(checks).sum().item())  # one read
        state["stage"] = _UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """optimizer.step(), unscaling first if unscale_ was not called, skipped (returning None)
        when a gradient is inf or NaN."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        state = self._state(optimizer)
        if state["stage"] is _STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] is _READY:
            self.unscale_(optimizer)
        result = None if state["found_inf"] else optimizer.step(*args, **kwargs)
        state["stage"] = _STEPPED
        return result

    def update(self, new_scale=None) -> None:
        """The scale for the next iteration: new_scale if given; else backed off after a
        skipped step, grown after growth_interval clean ones."""
        if not self._enabled:
            return
        if new_scale is not None:
            value = new_scale.item() if isinstance(new_scale, Tensor) else new_scale
            if not isinstance(value, (int, float)):
                raise ValueError("GradScaler.update: new_scale must be a float or a one-element tensor")
            self._scale = _f32(value)
        else:
            found = [s["found_inf"] for s in self._per_optimizer.values() if s["stage"] is not _READY]
            if not found:
                raise RuntimeError("No inf checks were recorded prior to update.")
            if any(found):
                self._scale, self._growth_tracker = _f32(np.float32(self._scale) * np.float32(self._backoff_factor)), 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    self._scale = _f32(np.float32(self._scale) * np.float32(self._growth_factor))
                    self._growth_tracker = 0
        self._per_optimizer = {}

    def get_scale(self) -> float:
        return self._scale if self._enabled else 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = new_interval

    def state_dict(self) -> dict:
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict: dict) -> None:
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        self._scale = _f32(state_dict["scale"])
        self._growth_factor = state_dict["growth_factor"]
        self._backoff_factor = state_dict["backoff_factor"]
        self._growth_interval = state_dict["growth_interval"]
        self._growth_tracker = state_dict["_growth_tracker"]
