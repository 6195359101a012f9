"""Learning-rate schedules (torch.optim.lr_scheduler style: call step() after optimizer.step())."""
from __future__ import annotations

import math


class LRScheduler:
    def __init__(self, optimizer, last_epoch: int = -1):
        self.optimizer = optimizer
        self.base_lrs = [g.setdefault("initial_lr", g["lr"]) for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def factor(self, step: int) -> float:
        raise NotImplementedError

    def get_last_lr(self) -> list:
        return [g["lr"] for g in self.optimizer.param_groups]

    def step(self) -> None:
        self.last_epoch += 1
        for g, base in zip(self.optimizer.param_groups, self.base_lrs):
            g["lr"] = base * self.factor(self.last_epoch)

    def state_dict(self) -> dict:
        return {"last_epoch": self.last_epoch, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state: dict) -> None:
        self.last_epoch = int(state["last_epoch"]) - 1
        self.base_lrs = list(state["base_lrs"])
        self.step()


class ConstantLR(LRScheduler):
    def factor(self, step: int) -> float:
        return 1.0


class LambdaLR(LRScheduler):
    def __init__(self, optimizer, lr_lambda, last_epoch: int = -1):
        self.lr_lambda = lr_lambda
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        return self.lr_lambda(step)


DECAYS = ("constant", "cosine", "linear")


class LinearWarmupDecayLR(LRScheduler):
    """Linear warmup from lr/warmup to lr over `warmup_steps` (step k uses (k+1)/warmup, as
    llm.c does), then `decay` to lr * min_lr_ratio at `total_steps`: "cosine" (llm.c's and
    Megatron's: min + (lr - min) (1 + cos(pi p)) / 2 at progress p), "linear" (min + (lr - min)
    (1 - p)) or "constant" (lr throughout); held at the minimum past total_steps."""

    decay = "cosine"

    def __init__(self, optimizer, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0,
                 last_epoch: int = -1, decay: str | None = None):
        name = type(self).__name__
        if warmup_steps < 0 or total_steps <= 0:
            raise ValueError(f"{name}: warmup_steps ({warmup_steps}) must be >= 0 and "
                             f"total_steps ({total_steps}) > 0")
        self.decay = decay or self.decay
        if self.decay not in DECAYS:
            raise ValueError(f"{name}: decay must be one of {', '.join(DECAYS)}, got {self.decay!r}")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"{name}: min_lr_ratio must be between 0 and 1, got {min_lr_ratio}")
        self.warmup, self.total, self.min_ratio = warmup_steps, total_steps, min_lr_ratio
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if self.decay == "constant":
            return 1.0
        if step >= self.total:
            return self.min_ratio
        progress = (step - self.warmup) / max(1, self.total - self.warmup)
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if self.decay == "cosine" else 1 - progress
        return self.min_ratio + (1 - self.min_ratio) * shape


class LinearWarmupCosineLR(LinearWarmupDecayLR):
    """Linear warmup, then cosine decay to lr * min_lr_ratio (LinearWarmupDecayLR's cosine)."""

    decay = "cosine"


class LinearWarmupConstantLR(LinearWarmupDecayLR):
    """Linear warmup, then constant."""

    decay = "constant"


class CosineAnnealingLR(LRScheduler):
    """torch.optim.lr_scheduler.CosineAnnealingLR: lr = eta_min + (base - eta_min) *
    (1 + cos(pi * step / T_max)) / 2; past T_max it rises again along the cosine, as PyTorch's
    (LinearWarmupCosineLR holds its minimum instead)."""

    def __init__(self, optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):
        if T_max <= 0:
            raise ValueError(f"CosineAnnealingLR: T_max must be > 0, got {T_max}")
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def step(self) -> None:
        self.last_epoch += 1
        t = self.last_epoch
        for g, base in zip(self.optimizer.param_groups, self.base_lrs):
            g["lr"] = self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * t / self.T_max)) / 2


class LinearLR(LRScheduler):
    """torch.optim.lr_scheduler.LinearLR: the factor goes linearly from start_factor to
    end_factor over total_iters steps (a linear warmup with start_factor < 1)."""

    def __init__(self, optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1):
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1 or total_iters < 0:
            raise ValueError("LinearLR: start_factor must be in (0, 1], end_factor in [0, 1] "
                             f"and total_iters >= 0, got {start_factor}, {end_factor}, {total_iters}")
        self.start, self.end, self.total = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        if self.total == 0 or step >= self.total:
            return self.end
        return self.start + (self.end - self.start) * step / self.total


class StepLR(LRScheduler):
    """torch.optim.lr_scheduler.StepLR: lr * gamma ** (step // step_size)."""

    def __init__(self, optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        if step_size < 1:
            raise ValueError(f"StepLR: step_size must be >= 1, got {step_size}")
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        return self.gamma ** (step // self.step_size)


class MultiStepLR(LRScheduler):
    """torch.optim.lr_scheduler.MultiStepLR: lr * gamma ** (milestones passed)."""

    def __init__(self, optimizer, milestones, gamma: float = 0.1, last_epoch: int = -1):
        self.milestones, self.gamma = sorted(int(m) for m in milestones), gamma
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        return self.gamma ** sum(step >= m for m in self.milestones)


class ExponentialLR(LRScheduler):
    """torch.optim.lr_scheduler.ExponentialLR: lr * gamma ** step."""

    def __init__(self, optimizer, gamma: float, last_epoch: int = -1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        return self.gamma ** step


class SequentialLR(LRScheduler):
    """torch.optim.lr_scheduler.SequentialLR: schedulers[i] runs from milestones[i - 1] on,
    each starting again from its own beginning at its milestone (a warmup, then a decay)."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch: int = -1):
        schedulers, milestones = list(schedulers), [int(m) for m in milestones]
        if len(milestones) != len(schedulers) - 1 or milestones != sorted(milestones):
            raise ValueError(f"SequentialLR: {len(schedulers)} schedulers need {len(schedulers) - 1} increasing "
                             f"milestones, got {milestones}")
        if any(s.optimizer is not optimizer for s in schedulers):
            raise ValueError("SequentialLR: every scheduler must drive this optimizer")
        self.optimizer, self.schedulers, self.milestones = optimizer, schedulers, milestones
        self.base_lrs = list(schedulers[0].base_lrs)
        self.last_epoch = last_epoch + 1
        self._restart(schedulers[0])  # each scheduler set the rates when built: the first one's count

    @staticmethod
    def _restart(scheduler) -> None:
        scheduler.last_epoch = -1
        scheduler.step()

    def step(self) -> None:
        import bisect
        self.last_epoch += 1
        i = bisect.bisect_right(self.milestones, self.last_epoch)
        if i > 0 and self.milestones[i - 1] == self.last_epoch:
            self._restart(self.schedulers[i])
        else:
            self.schedulers[i].step()

    def state_dict(self) -> dict:
        return {"last_epoch": self.last_epoch, "schedulers": [s.state_dict() for s in self.schedulers]}

    def load_state_dict(self, state: dict) -> None:
        self.last_epoch = int(state["last_epoch"])
        for s, st in zip(self.schedulers, state["schedulers"]):
            s.load_state_dict(st)


class OneCycleLR(LRScheduler):
    """torch.optim.lr_scheduler.OneCycleLR: the learning rate rises from max_lr / div_factor to
    max_lr over pct_start of total_steps, then anneals to initial / final_div_factor (three_phase:
    back down to the initial lr first, then to the minimum), cosine or linear; with
    cycle_momentum the momentum (SGD's momentum, Adam's beta1) moves the opposite way between
    max_momentum and base_momentum. Stepping past total_steps is an error, as in PyTorch."""

    def __init__(self, optimizer, max_lr, total_steps: int | None = None, epochs: int | None = None,
                 steps_per_epoch: int | None = None, pct_start: float = 0.3, anneal_strategy: str = "cos",
                 cycle_momentum: bool = True, base_momentum: float = 0.85, max_momentum: float = 0.95,
                 div_factor: float = 25.0, final_div_factor: float = 1e4, three_phase: bool = False,
                 last_epoch: int = -1):
        if total_steps is None:
            if not epochs or not steps_per_epoch or epochs <= 0 or steps_per_epoch <= 0:
                raise ValueError("OneCycleLR: give total_steps, or epochs and steps_per_epoch (all positive)")
            total_steps = epochs * steps_per_epoch
        if total_steps <= 0:
            raise ValueError(f"OneCycleLR: total_steps must be positive, got {total_steps}")
        if not 0 <= pct_start <= 1:
            raise ValueError(f"OneCycleLR: pct_start must be in [0, 1], got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        groups = optimizer.param_groups
        max_lrs = list(max_lr) if isinstance(max_lr, (list, tuple)) else [max_lr] * len(groups)
        if len(max_lrs) != len(groups):
            raise ValueError(f"OneCycleLR: {len(max_lrs)} max_lr values for {len(groups)} parameter groups")
        self.total_steps, self.anneal = total_steps, anneal_strategy
        T = float(total_steps)
        # (the step a phase ends at, the group key it starts from, the key it ends at)
        self.phases = [(pct_start * T - 1, "initial_lr", "max_lr"),
                       (2 * pct_start * T - 2, "max_lr", "initial_lr"),
                       (T - 1, "initial_lr", "min_lr")] if three_phase else \
                      [(pct_start * T - 1, "initial_lr", "max_lr"), (T - 1, "max_lr", "min_lr")]
        self.momentum_key = None
        if cycle_momentum:
            self.momentum_key = "betas" if "betas" in groups[0] else "momentum" if "momentum" in groups[0] else None
            if self.momentum_key is None:
                raise ValueError("OneCycleLR: the optimizer must have momentum or beta1 for cycle_momentum=True")
        for g, m in zip(groups, max_lrs):
            g["initial_lr"], g["max_lr"] = m / div_factor, m
            g["min_lr"] = g["initial_lr"] / final_div_factor
            if self.momentum_key:
                g["max_momentum"], g["base_momentum"] = max_momentum, base_momentum
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal == "linear":
            return (end - start) * pct + start
        return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)

    def step(self) -> None:
        self.last_epoch += 1
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"OneCycleLR: tried to step {step} times, more than total_steps "
                             f"{self.total_steps}")
        momentum_of = {"initial_lr": "max_momentum", "max_lr": "base_momentum", "min_lr": "max_momentum"}
        for g in self.optimizer.param_groups:
            start = 0.0
            for i, (end, a, b) in enumerate(self.phases):
                if step <= end or i == len(self.phases) - 1:
                    pct = (step - start) / (end - start)
                    g["lr"] = self._anneal(g[a], g[b], pct)
                    if self.momentum_key:
                        m = self._anneal(g[momentum_of[a]], g[momentum_of[b]], pct)
                        if self.momentum_key == "betas":
                            g["betas"] = (m, *g["betas"][1:])
                        else:
                            g["momentum"] = m
                    break
                start = end


class ReduceLROnPlateau(LRScheduler):
    """The learning rate times factor once a watched metric (step(metric), a validation loss)
    has not improved by threshold for more than patience steps; then cooldown steps before
    counting again, and never below min_lr (a number, or one per parameter group)."""

    def __init__(self, optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0, min_lr=0, eps: float = 1e-8):
        if factor >= 1.0:
            raise ValueError("ReduceLROnPlateau: factor should be < 1.0")
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise ValueError(f"ReduceLROnPlateau: mode must be 'min' or 'max' and threshold_mode 'rel' or 'abs', "
                             f"got {mode!r}, {threshold_mode!r}")
        groups = optimizer.param_groups
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != len(groups):
                raise ValueError(f"ReduceLROnPlateau: expected {len(groups)} min_lrs, got {len(min_lr)}")
            self.min_lrs = list(min_lr)
        else:
            self.min_lrs = [min_lr] * len(groups)
        # no LRScheduler.__init__: the rate changes only when a metric says so
        self.optimizer, self.mode, self.factor, self.patience = optimizer, mode, factor, patience
        self.threshold, self.threshold_mode, self.cooldown, self.eps = threshold, threshold_mode, cooldown, eps
        self.cooldown_counter, self.num_bad_epochs, self.last_epoch = 0, 0, 0
        self.best = math.inf if mode == "min" else -math.inf
        self._last_lr = [g["lr"] for g in groups]

    def is_better(self, a: float, best: float) -> bool:
        if self.mode == "min":
            return a < (best * (1.0 - self.threshold) if self.threshold_mode == "rel" else best - self.threshold)
        return a > (best * (self.threshold + 1.0) if self.threshold_mode == "rel" else best + self.threshold)

    def step(self, metrics) -> None:  # noqa: D102  (PyTorch's name for the watched value)
        current = float(metrics)
        self.last_epoch += 1
        if self.is_better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for g, low in zip(self.optimizer.param_groups, self.min_lrs):
                new = max(float(g["lr"]) * self.factor, low)
                if float(g["lr"]) - new > self.eps:
                    g["lr"] = new
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def get_last_lr(self) -> list:
        return list(self._last_lr)

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state: dict) -> None:
        self.__dict__.update(state)
