"""DeepSpeed's learning-rate schedules (deepspeed.runtime.lr_schedules), by their formulas, with
DeepSpeed's names and parameters. `i` is the schedule's last_batch_iteration, which step()
advances once per optimizer step (the engine calls it at each accumulation boundary).

- WarmupLR: lr = min + (max - min) * gamma, gamma = log(i + 1) / log(W) ("log") or i / W
  ("linear") while i < W, then 1 (W = max(2, warmup_num_steps)).
- WarmupDecayLR: the same warm-up, then gamma = max(0, (T - i) / max(1, T - W)) (T: total_num_steps).
- WarmupCosineLR: a ratio of each group's own lr: during warm-up r0 + (1 - r0) * gamma
  (r0 = warmup_min_ratio), then c + (1 - c) * (1 + cos(pi * (i - W + 1) / (T - W))) / 2, at
  least 0 (c = cos_min_ratio).
- OneCycle: over a cycle of S1 + S2 iterations (cycle_first_step_size, cycle_second_step_size)
  the lr rises linearly from cycle_min_lr to cycle_max_lr over the first S1 and falls back
  over the next S2, with x the position of i + 1 in the cycle; afterwards (decay_step_size > 0
  and decay_lr_rate > 0) lr = cycle_min_lr / (1 + decay_lr_rate * (i - S1 - S2 + 1) /
  decay_step_size). With cycle_momentum, Adam's beta1 moves the other way between
  cycle_max_mom and cycle_min_mom (beta2 set to 0.99, as DeepSpeed does).

Before the first step() each group's lr is the schedule's value at iteration 0 (for the warm-ups
warmup_min_lr, or warmup_min_ratio of the lr); OneCycle's is cycle_min_lr and cycle_min_mom, as
DeepSpeed sets them.
"""
from __future__ import annotations

import math
import warnings

LOG, LINEAR = "log", "linear"


def _per_group(optimizer, value, name: str) -> list:
    n = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name}: {len(value)} values for {n} parameter groups")
        return [float(v) for v in value]
    return [float(value)] * n


def _defaults(optimizer) -> dict:
    """The optimizer's defaults (ZeRO's and offload's wrappers: their inner optimizer's)."""
    while not hasattr(optimizer, "defaults") and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return getattr(optimizer, "defaults", {})


class _Schedule:
    """step(), get_lr(), get_last_lr(), state_dict() as DeepSpeed's schedules have them."""

    def __init__(self, optimizer, last_batch_iteration: int):
        self.optimizer = optimizer
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration < 0:
            self._start()
        else:
            self._set(last_batch_iteration)

    def _start(self) -> None:
        """The settings before the first step()."""
        self._set(0)

    def lrs_at(self, i: int) -> list:
        raise NotImplementedError

    def get_lr(self) -> list:
        return self.lrs_at(max(self.last_batch_iteration, 0))

    def _set(self, i: int) -> None:
        for group, lr in zip(self.optimizer.param_groups, self.lrs_at(i)):
            group["lr"] = lr
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def step(self, last_batch_iteration: int | None = None) -> None:
        self.last_batch_iteration = self.last_batch_iteration + 1 if last_batch_iteration is None \
            else last_batch_iteration
        self._set(self.last_batch_iteration)

    def get_last_lr(self) -> list:
        return list(self._last_lr)

    def state_dict(self) -> dict:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: dict) -> None:
        self.last_batch_iteration = int(state["last_batch_iteration"])
        self._set(max(self.last_batch_iteration, 0))


def _warmup_gamma(i: int, warmup: int, kind: str) -> float | None:
    """The warm-up's fraction at iteration i, or None past it."""
    if i >= warmup:
        return None
    return math.log(i + 1) / math.log(warmup) if kind == LOG else i / warmup


def _check_type(warmup_type: str) -> str:
    if warmup_type not in (LOG, LINEAR):
        raise ValueError(f"warmup_type must be 'log' or 'linear', got {warmup_type!r}")
    return warmup_type


class WarmupLR(_Schedule):
    def __init__(self, optimizer, warmup_min_lr=0.0, warmup_max_lr=0.001, warmup_num_steps: int = 1000,
                 warmup_type: str = LOG, last_batch_iteration: int = -1):
        self.min_lrs = _per_group(optimizer, warmup_min_lr, "warmup_min_lr")
        self.max_lrs = _per_group(optimizer, warmup_max_lr, "warmup_max_lr")
        self.warmup_num_steps = max(2, int(warmup_num_steps))
        self.warmup_type = _check_type(warmup_type)
        super().__init__(optimizer, last_batch_iteration)

    def gamma(self, i: int) -> float:
        g = _warmup_gamma(i, self.warmup_num_steps, self.warmup_type)
        return 1.0 if g is None else g

    def lrs_at(self, i: int) -> list:
        g = self.gamma(i)
        return [lo + (hi - lo) * g for lo, hi in zip(self.min_lrs, self.max_lrs)]


class WarmupDecayLR(WarmupLR):
    def __init__(self, optimizer, total_num_steps: int, warmup_min_lr=0.0, warmup_max_lr=0.001,
                 warmup_num_steps: int = 1000, warmup_type: str = LOG, last_batch_iteration: int = -1):
        self.total_num_steps = int(total_num_steps)
        if self.total_num_steps < warmup_num_steps:
            warnings.warn(f"WarmupDecayLR: total_num_steps {total_num_steps} is less than warmup_num_steps "
                          f"{warmup_num_steps}", stacklevel=2)
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
                         last_batch_iteration)

    def gamma(self, i: int) -> float:
        g = _warmup_gamma(i, self.warmup_num_steps, self.warmup_type)
        if g is not None:
            return g
        return max(0.0, (self.total_num_steps - i) / max(1.0, self.total_num_steps - self.warmup_num_steps))


class WarmupCosineLR(_Schedule):
    def __init__(self, optimizer, total_num_steps: int, warmup_min_ratio: float = 0.0,
                 warmup_num_steps: int = 1000, cos_min_ratio: float = 0.0001, warmup_type: str = LOG,
                 last_batch_iteration: int = -1):
        self.total_num_steps = int(total_num_steps)
        self.warmup_min_ratio, self.cos_min_ratio = float(warmup_min_ratio), float(cos_min_ratio)
        self.warmup_num_steps = max(2, int(warmup_num_steps))
        self.warmup_type = _check_type(warmup_type)
        if self.total_num_steps < self.warmup_num_steps:
            warnings.warn(f"WarmupCosineLR: total_num_steps {total_num_steps} is less than warmup_num_steps "
                          f"{warmup_num_steps}", stacklevel=2)
        self.org_lrs = [g["lr"] for g in optimizer.param_groups]  # the ratio's 1
        super().__init__(optimizer, last_batch_iteration)

    def ratio(self, i: int) -> float:
        g = _warmup_gamma(i, self.warmup_num_steps, self.warmup_type)
        if g is not None:
            return self.warmup_min_ratio + (1.0 - self.warmup_min_ratio) * g
        progress = (i - self.warmup_num_steps + 1) / max(1, self.total_num_steps - self.warmup_num_steps)
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * (1 + math.cos(math.pi * progress)) / 2)

    def lrs_at(self, i: int) -> list:
        r = self.ratio(i)
        return [lr * r for lr in self.org_lrs]

    def state_dict(self) -> dict:
        return {**super().state_dict(), "org_lrs": list(self.org_lrs)}

    def load_state_dict(self, state: dict) -> None:
        self.org_lrs = list(state.get("org_lrs", self.org_lrs))
        super().load_state_dict(state)


class OneCycle(_Schedule):
    def __init__(self, optimizer, cycle_min_lr, cycle_max_lr, decay_lr_rate: float = 0.0,
                 cycle_first_step_size: int = 2000, cycle_second_step_size: int | None = None,
                 cycle_first_stair_count: int = 0, cycle_second_stair_count: int | None = None,
                 decay_step_size: int = 0, cycle_momentum: bool = True, cycle_min_mom: float = 0.8,
                 cycle_max_mom: float = 0.9, decay_mom_rate: float = 0.0, last_batch_iteration: int = -1):
        first = float(cycle_first_step_size)
        second = float(cycle_second_step_size) if cycle_second_step_size is not None else first
        self.total_size, self.step_ratio = first + second, first / (first + second)
        self.first_stair_count = cycle_first_stair_count  # kept as DeepSpeed keeps them: unused by its formula
        self.second_stair_count = cycle_first_stair_count if cycle_second_stair_count is None \
            else cycle_second_stair_count
        self.decay_step_size = decay_step_size
        self.min_lrs = _per_group(optimizer, cycle_min_lr, "cycle_min_lr")
        self.max_lrs = _per_group(optimizer, cycle_max_lr, "cycle_max_lr")
        self.decay_lr_rate, self.decay_mom_rate = float(decay_lr_rate), float(decay_mom_rate)
        self.skip_lr_decay = decay_step_size == 0 or self.decay_lr_rate == 0
        self.skip_mom_decay = decay_step_size == 0 or self.decay_mom_rate == 0
        self.cycle_momentum = bool(cycle_momentum)
        if self.cycle_momentum and "betas" not in _defaults(optimizer):
            warnings.warn(f"OneCycle: cycle_momentum is off: {type(optimizer).__name__} has no betas", stacklevel=2)
            self.cycle_momentum = False
        n = len(optimizer.param_groups)
        self.min_moms, self.max_moms = [(cycle_min_mom, 0.99)] * n, [(cycle_max_mom, 0.99)] * n
        super().__init__(optimizer, last_batch_iteration)

    def scale(self, i: int) -> float:
        """Where iteration i is on the cycle's triangle: 0 at its ends, 1 at its peak."""
        at = (i + 1) / self.total_size
        x = 1.0 + at - math.floor(1 + at)
        return x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)

    def lrs_at(self, i: int) -> list:
        if i < self.total_size:
            s = self.scale(i)
            return [lo + (hi - lo) * s for lo, hi in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return list(self.min_lrs)
        factor = 1 + self.decay_lr_rate * (i - self.total_size + 1) / self.decay_step_size
        return [lo / factor for lo in self.min_lrs]

    def moms_at(self, i: int) -> list:
        if i < self.total_size:
            s = self.scale(i)
            return [(hi[0] - (hi[0] - lo[0]) * s, lo[1]) for lo, hi in zip(self.min_moms, self.max_moms)]
        if self.skip_mom_decay:
            return list(self.max_moms)
        factor = 1 + self.decay_mom_rate * (i - self.total_size + 1) / self.decay_step_size
        return [(b0 * factor, b1) for b0, b1 in self.max_moms]

    def _start(self) -> None:  # DeepSpeed's: the cycle's minimum lr and momentum
        for group, lr, betas in zip(self.optimizer.param_groups, self.min_lrs, self.min_moms):
            group["lr"] = lr
            if self.cycle_momentum:
                group["betas"] = betas
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def _set(self, i: int) -> None:
        super()._set(i)
        if self.cycle_momentum:
            for group, betas in zip(self.optimizer.param_groups, self.moms_at(i)):
                group["betas"] = betas


SCHEDULES = {"WarmupLR": WarmupLR, "WarmupDecayLR": WarmupDecayLR, "WarmupCosineLR": WarmupCosineLR,
             "OneCycle": OneCycle}
