"""DeepSpeedEngine: DeepSpeed's training loop (`loss = engine(batch)`, `engine.backward(loss)`,
`engine.step()`) on infinitrain's own TrainStep, split where DeepSpeed splits it:

- forward: the model under the step's wrappers (TrainStep.net: DDP, or the model itself under
  ZeRO, whose optimizer reduces), with DDP's reduction held back (no_sync) on every micro-batch
  but the one that ends the accumulation, and under bf16 autocast when the config asks;
- backward: the loss divided by gradient_accumulation_steps (finalize.scale_loss, as TrainStep
  and DeepSpeed divide it), then its backward: the accumulated gradients are the mean over the
  micro-batches, reduced over data parallelism at the boundary;
- step: at the boundary only, TrainStep.optimizer_step (every gradient fix-up, the norm and
  clipping, the optimizer, zero_grad), then the schedule; elsewhere nothing.

So the gradients and the updates are TrainStep's, bit for bit: the same code runs them.
Checkpoints are infinitrain's (checkpoint.save_checkpoint), named by DeepSpeed's tag, with the
engine's counters, the schedule's state and the caller's client_state in their meta.json.
"""
from __future__ import annotations

import re
import time
import warnings
from contextlib import nullcontext
from pathlib import Path

from ..amp import autocast
from ..checkpoint import load_checkpoint, resolve, save_checkpoint
from ..dtypes import bfloat16
from ..monitor import Monitor
from ..nn.moe import aux_loss_scale
from ..nn.parallel.finalize import scale_loss
from ..profiler import profile

_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


class DeepSpeedEngine:
    """Built by initialize(). trainer: the TrainStep that runs the step; config: the parsed
    DeepSpeedConfig; lr_scheduler: stepped once per optimizer step (or None)."""

    def __init__(self, trainer, config, lr_scheduler=None, env=None, dataloader=None):
        self.trainer, self.config, self.lr_scheduler, self.env = trainer, config, lr_scheduler, env
        self.module = trainer.model
        self.optimizer = trainer.optimizer
        self.training_dataloader = dataloader
        self.device = next(iter(self.module.parameters())).device
        self.global_steps = 0  # optimizer steps taken
        self.global_samples = 0  # samples they were taken on, over all ranks
        self.micro_steps = 0  # micro-batches through step()
        self.skipped_steps = 0  # DeepSpeed's count of overflowed fp16 steps: always 0 here (no fp16)
        self._grad_norm = None
        self._step_applied = False
        self._times = {"forward": 0.0, "backward": 0.0, "step": 0.0}
        self._profiler = None
        # the config's tensorboard / csv_monitor blocks (DeepSpeed's engine.monitor): rank 0 writes
        # Train/Samples/train_loss and lr at each optimizer step, against the samples trained on
        blocks = config.monitor
        self.monitor = Monitor.from_deepspeed_config(blocks.get("tensorboard"), blocks.get("csv_monitor"),
                                                     enabled=self._is_main())
        self._losses = []  # this step's micro-batch losses, kept only while the monitor writes

    # ---- what DeepSpeed's engine answers --------------------------------------------------
    def train_batch_size(self) -> int:
        return self.config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self.config.gradient_accumulation_steps

    def gradient_clipping(self) -> float:
        return self.config.gradient_clipping

    def zero_optimization_stage(self) -> int:
        return self.trainer.plan.zero_stage

    def bfloat16_enabled(self) -> bool:
        return self.config.bf16

    def fp16_enabled(self) -> bool:
        return False


    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether the micro-batch now being run ends the accumulation (its step() steps)."""
        return (self.micro_steps + 1) % self.config.gradient_accumulation_steps == 0

    def get_global_grad_norm(self):
        """The gradient norm over all ranks of the last optimizer step, before clipping (None
        without gradient_clipping, where the step computes none)."""
        return self._grad_norm

    def get_lr(self) -> list:
        return [g["lr"] for g in self.optimizer.param_groups]

    def get_mom(self) -> list:
        return [g.get("betas", (g.get("momentum"),))[0] for g in self.optimizer.param_groups]

    def was_step_applied(self) -> bool:
        """Whether the last step() updated the parameters (only at a boundary: no fp16 overflow skips here)."""
        return self._step_applied

    def parameters(self, recurse: bool = True):
        return self.module.parameters(recurse)

    def named_parameters(self, *args, **kwargs):
        return self.module.named_parameters(*args, **kwargs)

    def train(self, mode: bool = True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    # ---- the loop -------------------------------------------------------------------------
    def __call__(self, *inputs, **kwargs):
        return self.forward(*inputs, **kwargs)

    def forward(self, *inputs, **kwargs):
        """The model's forward on this micro-batch, under the step's wrappers."""
        t0 = time.perf_counter()
        self._maybe_profile()
        boundary = self.is_gradient_accumulation_boundary()
        net = self.trainer.net
        hold = net.no_sync() if net is not self.module and not boundary else nullcontext()
        if boundary and self.trainer.streaming is not None:  # the last backward streams its gradients
            self.trainer.streaming.arm()
        with hold, autocast(self.device.type, dtype=bfloat16, enabled=self.config.bf16):
            out = net(*inputs, **kwargs)
        self._times["forward"] += time.perf_counter() - t0
        return out

    def backward(self, loss, retain_graph: bool = False, scale_wrt_gas: bool = True):
        """Backward of this micro-batch's loss, divided by gradient_accumulation_steps (so that
        the accumulated gradients are the mean, as DeepSpeed and TrainStep take it). Returns the
        loss as given."""
        t0 = time.perf_counter()
        gas = self.config.gradient_accumulation_steps if scale_wrt_gas else 1
        with aux_loss_scale(1.0 / gas):  # MoE auxiliary losses scaled as the loss (nn.moe.aux_loss)
            scale_loss(loss, gas).backward(retain_graph=retain_graph)
        if self.monitor.active:
            self._losses.append(float(loss.detach().float().item()))
        self._times["backward"] += time.perf_counter() - t0
        return loss

    def step(self, lr_kwargs: dict | None = None) -> None:
        """At the accumulation boundary: the optimizer step (gradients reduced and fixed up,
        clipped to gradient_clipping, the update, zero_grad), then the schedule's step.
        Elsewhere it only counts the micro-batch."""
        t0 = time.perf_counter()
        self._step_applied = False
        if self.is_gradient_accumulation_boundary():
            self._grad_norm = self.trainer.optimizer_step(self.config.gradient_clipping)
            self._step_applied = True
            if self.lr_scheduler is not None:
                self.lr_scheduler.step(**(lr_kwargs or {}))
            self.global_steps += 1
            self.global_samples += self.config.train_batch_size
            self._times["step"] += time.perf_counter() - t0
            if self.monitor.active:
                self.monitor.log(self.global_samples, **{
                    "Train/Samples/train_loss": sum(self._losses) / len(self._losses) if self._losses else None,
                    "Train/Samples/lr": self.get_lr()[0]})
                self._losses = []
            self._report()
        self.micro_steps += 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def _report(self) -> None:
        """DeepSpeed's per-step line every steps_per_print optimizer steps (rank 0), and the
        forward/backward/step times with wall_clock_breakdown."""
        self._end_profile()
        if self.global_steps % self.config.steps_per_print or not self._is_main():
            return
        print(f"[Rank 0] step={self.global_steps}, skipped={self.skipped_steps}, "
              f"lr={self.get_lr()}, mom={self.get_mom()}", flush=True)
        if self.config.wall_clock_breakdown:
            n = self.config.steps_per_print
            fwd, bwd, opt = (self._times[k] * 1000 / n for k in ("forward", "backward", "step"))
            print(f"time (ms) | fwd: {fwd:.2f} | bwd: {bwd:.2f} | step: {opt:.2f} (means over the last {n} steps)",
                  flush=True)
        self._times = dict.fromkeys(self._times, 0.0)

    def _is_main(self) -> bool:
        return self.env is None or self.env.is_main

    def _maybe_profile(self) -> None:
        """flops_profiler: the profile_step-th optimizer step (all its micro-batches) under
        infinitrain's profiler, its table printed (or written to output_file) by rank 0."""
        fp = self.config.flops_profiler
        first_micro = self.micro_steps % self.config.gradient_accumulation_steps == 0
        if fp.get("enabled") and first_micro and self.global_steps + 1 == fp["profile_step"] and not self._profiler:
            self._profiler = profile().__enter__()

    def _end_profile(self) -> None:
        if self._profiler is None:
            return
        prof, self._profiler = self._profiler, None
        prof.__exit__(None, None, None)
        if self._is_main():
            table = prof.table()
            out = self.config.flops_profiler.get("output_file")
            if out:
                Path(out).write_text(table + "\n")
            else:
                print(f"profile of step {self.global_steps}:\n{table}", flush=True)

    # ---- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, save_dir, tag=None, client_state={}, save_latest: bool = True,  # noqa: B006 (DeepSpeed's)
                        exclude_frozen_parameters: bool = False):
        """Writes save_dir/<tag>/ (tag: "global_step<N>" by default) and points save_dir/latest
        at it: the model, the optimizer's state (ZeRO's shards gathered), the RNG, the
        engine's counters, the schedule and client_state (JSON: numbers, strings, lists,
        dicts). Collective: every rank calls it. Returns True, as DeepSpeed's does."""
        if not save_latest:
            raise ValueError("save_checkpoint(save_latest=False): the checkpoint writer always points 'latest' at "
                             "the newest checkpoint (it is how a killed save leaves the previous one in place)")
        if exclude_frozen_parameters:
            raise ValueError("save_checkpoint(exclude_frozen_parameters=True) is not supported: checkpoints hold "
                             "every parameter (save LoRA adapters alone with infinitrain.checkpoint.save_lora)")
        tag = f"global_step{self.global_steps}" if tag is None else str(tag)
        if not _TAG.fullmatch(tag) or tag == "latest":
            raise ValueError(f"checkpoint tag {tag!r} must be a folder name of letters, digits, '_', '.' and '-' "
                             "(not 'latest')")
        state = {"global_steps": self.global_steps, "global_samples": self.global_samples,
                 "micro_steps": self.micro_steps, "skipped_steps": self.skipped_steps,
                 "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
                 "client_state": dict(client_state or {})}
        save_checkpoint(save_dir, self.global_steps, self.module, self.optimizer, extra={"deepspeed": state},
                        write=self.trainer.plan.writes_files, name=tag)
        return True

    def load_checkpoint(self, load_dir, tag=None, load_module_strict: bool = True, load_optimizer_states: bool = True,
                        load_lr_scheduler_states: bool = True, load_module_only: bool = False):
        """Loads load_dir/<tag>/ (tag None: the one load_dir/latest names) into the model, and
        unless told otherwise the optimizer's state, the schedule and the engine's counters.
        Returns (the checkpoint's path, its client_state), or (None, None) with a warning
        when load_dir holds no checkpoint, as DeepSpeed does."""
        if not load_module_strict:
            raise ValueError("load_checkpoint(load_module_strict=False) is not supported: a checkpoint must fit "
                             "the model exactly (the error names what does not)")
        root = Path(load_dir)
        if tag is None and not (root / "latest").is_file() and not (root / "meta.json").is_file():
            warnings.warn(f"load_checkpoint: {root} holds no 'latest' file; nothing loaded", stacklevel=2)
            return None, None
        folder = resolve(root / str(tag) if tag is not None else root)
        with_optimizer = load_optimizer_states and not load_module_only
        meta = load_checkpoint(folder, self.module, self.optimizer if with_optimizer else None)
        state = (meta.get("extra") or {}).get("deepspeed", {})
        if not load_module_only:
            self.global_steps = int(state.get("global_steps", meta["step"]))
            self.global_samples = int(state.get("global_samples", self.global_steps * self.train_batch_size()))
            self.micro_steps = int(state.get("micro_steps", self.global_steps * self.gradient_accumulation_steps()))
            self.skipped_steps = int(state.get("skipped_steps", 0))
            sched = state.get("lr_scheduler")
            if load_lr_scheduler_states and self.lr_scheduler is not None and sched is not None:
                self.lr_scheduler.load_state_dict(sched)
        return str(folder), state.get("client_state", {})
