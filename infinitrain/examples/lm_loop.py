"""The steps of a language-model run and what surrounds them (the loop the GPT-2 and LLaMA-3
examples share; lm_train.py sets the job up): data, the learning-rate schedule, resuming,
evaluation, samples, the per-step log line, profiling, precision checks, checkpoints and the
epilogue."""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from pathlib import Path

import infinitrain as it
from infinitrain import profiler
from infinitrain.amp import autocast
from infinitrain.checkpoint import (CheckpointError, load_checkpoint, resolve, save_checkpoint, save_checkpoint_async,
                                    save_lora, save_pretrained)
from infinitrain.checkpoint.writer import recorded_step
from infinitrain.data import Tokenizer, TokenLoader
from infinitrain.io import progress
from infinitrain.examples import mfu
from infinitrain.examples.flags import check_outputs, open_monitor, refuse, stop_if_not_finite
from infinitrain.nn import parallel
from infinitrain.examples.ds_flags import config_schedule
from infinitrain.examples.moe_flags import MoEStepLog
from infinitrain.optim.lr_scheduler import LinearWarmupDecayLR
from infinitrain.plot import plot_losses
from infinitrain.precision_checker import PrecisionCheckConfig, PrecisionChecker


def restart_count() -> int:
    """Which restart of the job this is (0: the first launch): mpi_launch --max_restarts sets
    torchrun's TORCHELASTIC_RESTART_COUNT."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def peak_flops(args, env, log) -> float:
    """The peak the MFU is measured against: --peak_tflops, or measured on every rank at once."""
    if args.peak_tflops:
        peak = args.peak_tflops * 1e12
        log(f"MFU against a peak of {peak / 1e9:.1f} GFLOP/s per rank (--peak_tflops)", flush=True)
        return peak
    peak = mfu.measure_peak_flops(args.dtype, env.world, env.device)
    t = it.tensor([peak], dtype=it.float64, device=env.device)
    env.world.all_reduce(t, parallel.ReduceOp.AVG)
    peak = t.item()
    log(f"MFU against a peak of {peak / 1e9:.1f} GFLOP/s per rank (measured: {args.dtype} matrix products "
        f"on all {env.world.size} ranks at once; --peak_tflops gives one)", flush=True)
    return peak


class TrainingLoop:
    """The steps of a run and what surrounds them: data, schedule, resume, evaluation, samples,
    the per-step log line, profiling, precision checks, checkpoints, the epilogue."""

    def __init__(self, args, env, plan, model, trainer, accum: int, log):
        self.args, self.env, self.plan, self.model, self.trainer = args, env, plan, model, trainer
        self.accum, self.layout, self.log = accum, plan.describe(), log
        self.optimizer, self.pipe = trainer.optimizer, trainer.pipe
        cfg, device, B, T = model.config, env.device, args.batch_size, args.sequence_length
        # measured (or given) once, kept for the whole run (nothing to measure against under --eval_only)
        self.peak = peak_flops(args, env, log) if not args.eval_only else None
        self.said_above_peak = False
        self.most_used_mb = 0  # this rank's highest step peak of the run (finish() reports every rank's)
        self.sigterm = False  # SIGTERM arrived (on_sigterm): the job stops after this step
        self.step_flops = mfu.flops_per_token(type(model).active_parameters(cfg), cfg.n_layer, cfg.n_embd, T) \
            * args.total_batch_size
        self.curves = {"train": [], "val": []}
        dp, rank = plan.dp, plan.coords.dp
        self.train_data = TokenLoader(args.input_bin, B, T, rank, dp, vocab_size=cfg.vocab_size, device=device)
        self.val_data = TokenLoader(args.input_val_bin, B, T, rank, dp, vocab_size=cfg.vocab_size, device=device) \
            if args.input_val_bin else None
        self.forward_context = lambda: autocast(device.type, dtype=args.dtype, enabled=args.dtype != "float32")  # noqa: E731
        self.tokenizer = Tokenizer(args.tokenizer_bin) if args.tokenizer_bin else None
        self.lr_schedule = config_schedule(args, self.optimizer) or LinearWarmupDecayLR(
            self.optimizer, args.warmup_iters, args.num_iteration,
            min_lr_ratio=args.min_lr / args.learning_rate if args.learning_rate else 0.0, decay=args.lr_decay)
        self.first = self.resume() + 1
        self.current_step = self.first
        self.check_outputs()
        self.monitor = open_monitor(args, env)  # --tensorboard_dir, --csv_log (rank 0 writes)
        self.pending_save = None  # an --async_save in flight
        self.prof = profiler.profile(device=device)  # a GPU run: its own GPU's time too
        self.profiling = ProfileWindow(args.profile, self.first, args.num_iteration, args.profile_steps)
        self.checker = self.precision_checker()
        self.moe = MoEStepLog(model, plan, device, args.moe_log_every, log)  # (inactive for a dense model)

    def resume(self) -> int:
        """The step --load's checkpoint is at (0 without one), its state restored."""
        args = self.args
        if not args.load:
            return 0
        try:
            meta = load_checkpoint(args.load, self.model, self.optimizer)
            self.train_data.load_state(meta["extra"]["train_loader"])
            self.lr_schedule.load_state_dict(meta["extra"]["schedule"])
        except CheckpointError as e:
            sys.exit(f"cannot resume: {e}")
        except (KeyError, TypeError, ValueError) as e:
            sys.exit(f"cannot resume from {args.load}: its data-loader or schedule state is missing "
                     f"or damaged ({type(e).__name__}: {e})")
        if args.eval_only:
            self.log(f"loaded {args.load} (step {meta['step']})", flush=True)
            return meta["step"]
        if meta["step"] + 1 > args.num_iteration and args.auto_resumed:  # a restart after the last save
            self.log(f"{args.load} is at step {meta['step']}: training was complete", flush=True)
            return meta["step"]
        if meta["step"] + 1 > args.num_iteration:
            refuse(f"{args.load} is at step {meta['step']}: --num_iteration {args.num_iteration} "
                     "leaves nothing to train; raise --num_iteration to train further")
        self.log(f"resumed from {args.load} at step {meta['step']}", flush=True)
        return meta["step"]

    def check_outputs(self) -> None:
        """Every output is checked before training, not after it; a --save folder holding
        another run's checkpoints at or past the steps this one will write is refused (their
        rotation and `latest` would mix the two runs)."""
        args = self.args
        ahead = []  # decided on rank 0 for every rank (a rank that refused alone would leave the others waiting)
        if self.env.is_main and args.save and Path(args.save).is_dir() and not args.eval_only:
            resumed_here = args.load and Path(args.load).resolve() in (Path(args.save).resolve(),
                                                                        *Path(args.save).resolve().iterdir())
            ahead = [] if resumed_here else sorted(
                p.name for p in Path(args.save).iterdir()
                if p.is_dir() and p.name.startswith("step_") and (recorded_step(p) or 0) >= self.first)
        if self.env.world.size > 1:
            ahead = self.env.comm.bcast(ahead, root=0)
        if ahead:
            refuse(f"--save {args.save} holds checkpoints of another run ({', '.join(ahead[:3])}"
                   f"{', ...' if len(ahead) > 3 else ''}) at or past step {self.first}, which this run would "
                   "write: resume that run (--resume auto, or --load it), or name an empty folder")
        check_outputs(folders=[("--save", args.save), ("--lora_save_path", args.lora_save_path),
                               ("--save_pretrained", args.save_pretrained)],
                      files=[("--profile", args.profile), ("--plot", args.plot)], plot=args.plot)

    def precision_checker(self):
        if not self.args.precision_check:
            return None
        env = self.env
        try:
            checker = PrecisionChecker(self.model, PrecisionCheckConfig.parse(self.args.precision_check),
                                       rank=env.rank, world=env.world.size, dp=(self.plan.coords.dp, self.plan.dp))
            checker.total_steps = self.args.num_iteration - self.first + 1
            return checker
        except ValueError as e:
            sys.exit(str(e))
        except OSError as e:
            sys.exit(f"--precision_check: cannot write to its output_path: {e.strerror or e} ({e.filename})")

    def save(self, step: int) -> None:
        # the files hold one-process tensors: TP shards are gathered, and each pipeline stage of
        # DP rank 0 writes its layers (its TP rank 0 does)
        # --async_save: the state is copied now and written by a thread while training goes on
        # (at most one save in flight: the next one waits for it)
        env, args = self.env, self.args
        self.finish_save(block=True)
        if self.plan.saves_checkpoint:  # ZeRO: every DP x CP rank holds a shard of the state
            save = save_checkpoint_async if args.async_save else save_checkpoint
            try:
                result = self._save(save, step)
            except CheckpointError as e:  # a full or read-only disk, on the writing rank: the job ends (exit_job)
                sys.exit(f"--save: {e}")
            fail_for_tests(env.rank, step, saving=True)
            if args.async_save:
                self.pending_save = result
                self.log(f"saving {Path(args.save) / f'step_{step:06d}'} in the background", flush=True)
            else:
                self.log(f"saved {result}", flush=True)
        if not args.async_save:
            env.world.barrier()

    def _save(self, save, step: int):
        """save_checkpoint(_async) of the model, the optimizer and what resumes the run."""
        args = self.args
        extra = {"train_loader": self.train_data.state(), "schedule": self.lr_schedule.state_dict(),
                 "total_batch_size": args.total_batch_size,
                 # what rebuilds the model from --load alone, and the run's flags
                 "model": {"class": type(self.model).__name__, "config": dataclasses.asdict(self.model.config)},
                 "args": {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, type(None)))}}
        return save(args.save, step, self.model, self.optimizer, extra=extra, keep=args.max_checkpoint_keep or None,
                    write=self.plan.writes_files)

    def finish_save(self, block: bool = False) -> None:
        """Commits a background save whose files are written (every step), or waits for it."""
        if self.pending_save is None:
            return
        try:
            done = self.pending_save.poll(block=block)
        except CheckpointError as e:
            sys.exit(f"--async_save: {e}")
        if done:
            if self.pending_save.path is not None:
                self.log(f"saved {self.pending_save.path}", flush=True)
            self.pending_save = None

    def evaluate(self, after_step: int) -> None:
        self.curves["val"].append((after_step, evaluate(self.model, self.val_data, self.args.val_max_steps,
                                                        self.trainer)))
        self.log(f"val loss {self.curves['val'][-1][1]:.6f}", flush=True)
        self.monitor.log(after_step, val_loss=self.curves["val"][-1][1])

    def evaluate_only(self) -> None:
        """--eval_only: the validation loss of the model as loaded (or initialised), nothing trained
        (and with --save_pretrained the model exported as it is)."""
        if self.val_data is None:
            refuse("--eval_only computes the validation loss: give --input_val_bin (a validation token shard)")
        self.evaluate(self.first - 1)
        self.monitor.close()
        self.export_pretrained()

    def export_pretrained(self) -> None:
        """--save_pretrained: the model in transformers' format (TP shards gathered, ZeRO-3's
        parameters gathered; the first replica's TP rank 0 writes)."""
        if not self.args.save_pretrained:
            return
        try:
            with self.trainer.gathered_parameters():
                save_pretrained(self.model, self.args.save_pretrained, write=self.plan.writes_files)
        except CheckpointError as e:  # on the writing rank only: the whole job ends (exit_job)
            sys.exit(f"--save_pretrained: {e}")
        self.env.world.barrier()
        self.log(f"saved the model in transformers' format to {self.args.save_pretrained}", flush=True)

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self.on_sigterm)
        with CtrlCInFinalizers() as ctrl_c:
            for step in range(self.first, self.args.num_iteration + 1):
                self.run_step(step)
                ctrl_c.raise_if_caught()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # after the steps, a SIGTERM ends the process again

    def run_step(self, step: int) -> None:
        """A step and what surrounds it: evaluation, profiling, the checkpoint, the sample, preemption."""
        args = self.args
        self.current_step = step
        if self.val_data is not None and args.val_loss_every and step == 1:
            self.evaluate(0)  # before training
        if self.profiling.starts(step):
            self.prof.__enter__()
        self.step(step)
        if self.profiling.ends(step):
            self.prof.__exit__(None, None, None)
            self.profiling.report(self.prof, self.env, self.log)
        if args.save and args.save_interval and step % args.save_interval == 0:
            self.save(step)
        else:
            self.finish_save()
        # after steps that are multiples of the intervals, as llm.c; the last step's are finish()'s
        if step < args.num_iteration and self.val_data is not None and args.val_loss_every \
                and step % args.val_loss_every == 0:
            self.evaluate(step)
        if step < args.num_iteration and self.tokenizer is not None and args.sample_every \
                and step % args.sample_every == 0:
            sample(self.model, self.tokenizer, args, self.env, self.plan, self.pipe)
        if step < args.num_iteration and self.preempted():
            self.stop_preempted(step)

    def on_sigterm(self, signum, frame) -> None:
        """SIGTERM (a scheduler's preemption, Slurm's --signal, a `kill`): noted, acted on at the
        next step boundary (stop_preempted), so that the step in flight finishes and is saved."""
        self.sigterm = True

    def preempted(self) -> bool:
        """Whether any rank was sent SIGTERM: every rank asks at every step boundary, so that all
        stop after the same step even when the signal reached them during different steps."""
        mine = int(self.sigterm)
        return bool(self.env.comm.allreduce(mine, op=_mpi_max())) if self.env.world.size > 1 else bool(mine)

    def stop_preempted(self, step: int) -> None:
        """Saves a checkpoint of this step (with --save) and ends the job with 143 (128 + SIGTERM,
        what a job killed by SIGTERM returns): mpi_launch --max_restarts starts it again, and with
        --resume auto it continues from this checkpoint, as a requeued Slurm job does."""
        if self.args.save:
            if not (self.args.save_interval and step % self.args.save_interval == 0):
                self.save(step)
            self.finish_save(block=True)
        saved = f"; saved {resolve(self.args.save)}" if self.args.save else " (no --save: nothing is kept)"
        self.log(f"preempted: SIGTERM received, stopping after step {step}{saved}", flush=True)
        self.monitor.close()
        self.env.world.barrier()
        sys.exit(PREEMPTED_EXIT_CODE)

    def step(self, step: int) -> None:
        """One optimizer step through the trainer's step, and its log line."""
        args, env, device = self.args, self.env, self.env.device
        fail_for_tests(env.rank, step)
        it.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        lr = self.optimizer.param_groups[0]["lr"]
        batches = [self.train_data.next_batch() for _ in range(self.accum)]
        if self.checker is not None:
            self.checker.begin_step(step)
        loss = self.trainer.forward_backward(batches, self.forward_context, step_during_backward=args.grad_clip == 0)
        if self.checker is not None:
            self.checker.end_step()
        self.stop_if_not_finite(step, "loss", loss)  # before the step writes it into the weights
        norm = self.trainer.optimizer_step(args.grad_clip)
        if norm is not None:
            self.stop_if_not_finite(step, "gradient norm", norm)
        self.lr_schedule.step()
        moe = self.moe.after_step(step)  # the selection biases follow the step's loads
        if device.type == "cuda":
            it.cuda.synchronize(device)  # the step's kernels are queued, not done
        ms = (time.perf_counter() - t0) * 1e3
        stats = it.memory_stats(device)  # in tensors, and held by the caching allocator (tensors + its cache)
        peak_mb, reserved_mb = stats["peak_allocated_bytes"] // 2**20, stats["peak_reserved_bytes"] // 2**20
        self.most_used_mb = max(self.most_used_mb, peak_mb)
        achieved = self.step_flops / (ms / 1e3) / env.world.size  # FLOP/s per rank
        # the peak stays what it was at the start, so that the figures of a run, and of runs with
        # the same peak, compare; a step above it is said once, not hidden by moving the peak
        if achieved > self.peak and not self.said_above_peak:
            self.said_above_peak = True
            self.log(f"note: step {step} ran at {achieved / 1e9:.1f} GFLOP/s per rank, above the "
                     f"{self.peak / 1e9:.1f} the MFU is measured against (MFU above 100%): the peak was measured "
                     "on a busy machine or given too low; --peak_tflops fixes it for every run", flush=True)
        utilisation = achieved / self.peak
        self.curves["train"].append((step, loss))
        self.log(f"step {step:4d}/{args.num_iteration} | train loss {loss:.6f} | {moe}lr {lr:.2e} | "
                 f"({ms:.2f} ms | {args.total_batch_size / ms * 1e3:.0f} tok/s | MFU {100 * utilisation:.1f}% | "
                 f"peak used: {peak_mb:5d} MB | peak reserved: {reserved_mb:5d} MB | {self.layout})", flush=True)
        self.monitor.log(step, train_loss=loss, lr=lr, grad_norm=norm, tokens_per_s=args.total_batch_size / ms * 1e3,
                         mfu=utilisation, peak_used_mb=peak_mb, peak_reserved_mb=reserved_mb,
                         **self.moe.scalars())

    def stop_if_not_finite(self, step: int, what: str, value: float) -> None:
        stop_if_not_finite(self.args, self.env, self.model, step, what, value)

    def report_memory(self) -> None:
        """Every rank's highest step peak of the run, on one line (the step lines show rank 0's;
        under a pipeline another stage may hold more): what the memory estimate is held to."""
        peaks = self.env.comm.gather(self.most_used_mb, root=0)
        if not self.env.is_main or len(peaks) < 2:
            return
        busiest = max(range(len(peaks)), key=peaks.__getitem__)
        stage = f", pipeline stage {self.plan.layout.coords(busiest).pp}" if self.plan.pipelined else ""
        self.log(f"peak used per rank (MB): {' '.join(map(str, peaks))} | the most: rank {busiest}{stage}, "
                 f"{peaks[busiest]} MB", flush=True)

    def finish(self) -> None:
        """The last checkpoint, adapters, evaluation, plot and sample."""
        args, env, model = self.args, self.env, self.model
        self.report_memory()
        trained = self.first <= args.num_iteration  # (a resumed run may have had nothing left to train)
        if args.save and trained and not (args.save_interval and args.num_iteration % args.save_interval == 0):
            self.save(args.num_iteration)
        self.finish_save(block=True)
        if self.checker is not None:
            for line in self.checker.close().splitlines():  # a line per write: ranks' lines stay whole
                print(line, flush=True)
        if args.lora_save_path:
            # PEFT's adapter_config names the base: the transformers folder this run writes or started from
            base = args.save_pretrained or args.from_pretrained
            save_lora(model, args.lora_save_path, write=self.plan.writes_files, optimizer=self.optimizer,
                      base_model=str(Path(base).resolve()) if base else None)
            env.world.barrier()
            self.log(f"saved LoRA adapters to {args.lora_save_path}", flush=True)
        self.export_pretrained()
        if self.val_data is not None and args.val_loss_every:
            self.evaluate(args.num_iteration)
        self.monitor.close()
        if args.plot and env.is_main:
            try:
                plot_losses({type(model).__name__: self.curves}, args.plot, f"{type(model).__name__} {self.layout}")
                self.log(f"wrote the loss curves to {args.plot}", flush=True)
            except (RuntimeError, ValueError, OSError) as e:
                print(f"could not draw {args.plot}: {e}", file=sys.stderr, flush=True)
        if self.tokenizer is not None and args.sample_every:
            sample(model, self.tokenizer, args, env, self.plan, self.pipe)
        offloaded = self.trainer.offloaded
        if offloaded is not None and offloaded.device == "nvme":
            store = offloaded.store
            self.log(f"offload (rank 0): read {store.bytes_read / 2**30:.2f} GB, "
                     f"wrote {store.bytes_written / 2**30:.2f} GB "
                     f"in {store.io_seconds:.1f} s of background I/O; the optimizer waited {store.waited:.1f} s for it",
                     flush=True)
        elif offloaded is not None:
            how = (f"{offloaded.streamed_bytes / 2**20:.1f} MB of the last step's gradients streamed to it during "
                   "backward" if self.trainer.streaming is not None else
                   "the gradients copied to it at each step (a pipeline without DDP's reducers, on one DP rank or "
                   "under ZeRO, knows them final only when its whole schedule has run)")
            self.log(f"offload (rank 0): the AdamW state in host memory; {how}", flush=True)


PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM  # 143, as a process ended by SIGTERM


class CtrlCInFinalizers:
    """Ctrl-C that Python would drop: the SIGINT handler raises KeyboardInterrupt at the next
    Python line the main thread runs, and when that line is a finalizer's (a __del__, a weakref
    callback, a generator closed by the garbage collector) Python prints "Exception ignored in"
    and carries on, and so would training. While this is installed (sys.unraisablehook), such a
    KeyboardInterrupt is noted instead, and raise_if_caught() raises it at the next step boundary."""

    def __enter__(self):
        self.caught, self.previous = False, sys.unraisablehook
        sys.unraisablehook = self._unraisable
        return self

    def _unraisable(self, unraisable) -> None:
        if unraisable.exc_type is KeyboardInterrupt:
            self.caught = True  # (and no traceback: the interrupt gets its one line)
        else:
            self.previous(unraisable)

    def raise_if_caught(self) -> None:
        if self.caught:
            raise KeyboardInterrupt

    def __exit__(self, *exc) -> None:
        sys.unraisablehook = self.previous


def _mpi_max():
    from mpi4py import MPI
    return MPI.MAX


def fail_for_tests(rank: int, step: int, saving: bool = False) -> None:
    """The tests' way to make a rank fail: INFINITRAIN_FAIL_AT="RANK:STEP:HOW[:always]" (HOW:
    kill, a SIGKILL; raise, an exception; stop, a SIGSTOP, at the start of that step;
    kill_in_save, a SIGKILL just after that step's checkpoint began to be written), on the
    first launch only (a restarted job must get past it) unless `always`; term, a SIGTERM to
    this rank at the start of that step, as a scheduler's preemption sends; int, a SIGINT to
    this rank alone (Ctrl-C that reached one rank)."""
    spec = os.environ.get("INFINITRAIN_FAIL_AT")
    if not spec:
        return
    r, s, how, *always = spec.split(":")
    if (how == "kill_in_save") != saving:
        return
    if int(r) == rank and int(s) == step and (always or not restart_count()):
        if how == "raise":
            raise RuntimeError(f"INFINITRAIN_FAIL_AT: rank {rank} fails at step {step}")
        signals = {"stop": signal.SIGSTOP, "term": signal.SIGTERM, "int": signal.SIGINT}
        os.kill(os.getpid(), signals.get(how, signal.SIGKILL))


class ProfileWindow:
    """Which steps --profile covers: from the second step trained (the first allocates and
    warms caches) for `count` steps, or the only step."""

    def __init__(self, path, first: int, last: int, count: int):
        self.path = path
        self.start = first + 1 if last > first else first
        self.stop = min(last, self.start + count - 1)

    def starts(self, step: int) -> bool:
        return self.path is not None and step == self.start

    def ends(self, step: int) -> bool:
        return self.path is not None and step == self.stop

    def report(self, prof, env, log) -> None:
        steps = self.stop - self.start + 1
        log(f"---- profile of steps {self.start}-{self.stop} (rank 0; {steps} step(s), "
            f"{prof.wall_ns / 1e6 / steps:.1f} ms per step) ----\n{prof.table()}", flush=True)
        overlap = prof.communication_overlap()
        if overlap["share"] is not None:
            log(f"communication: {overlap['comm_ns'] / 1e6:.1f} ms on rank 0, {overlap['share']:.0%} of it "
                "hidden behind computation (the rest the step waited for)", flush=True)
        prof.export_chrome_trace(self.path, group=env.world)
        log(f"wrote the Chrome trace of every rank to {self.path} (open it in ui.perfetto.dev "
            "or chrome://tracing)", flush=True)


@it.no_grad()
def evaluate(model, loader, max_steps: int, trainer) -> float:
    """The mean validation loss over max_steps batches (fewer if the split is short), over DP."""
    pipe = trainer.pipe
    model.eval()
    loader.reset()
    steps = max(1, min(max_steps, len(loader.shards[0]) // (loader.B * loader.T * loader.world)))
    total = 0.0
    for _ in progress(range(steps), desc="evaluating", unit="batch"):
        x, y = loader.next_batch()
        total += pipe.eval_step([(x, y)]) if pipe is not None else model(x, y, return_logits=False)[1].item()
    model.train()
    return trainer.dp_mean(total / steps)


def sample(model, tokenizer, args, env, plan, pipe=None) -> None:
    """The main rank prints a sample; the ranks holding the rest of its model run the model along
    (ParallelPlan.runs_generation)."""
    if not plan.runs_generation:
        return
    model.eval()
    start = it.tensor([[tokenizer.eot_token]])
    out = model.generate(start, args.sample_length, temperature=1.0, top_k=40, seed=args.seed,
                         forward=pipe.logits if pipe is not None else None)
    model.train()
    if not env.is_main:
        return
    text = tokenizer.decode(out.numpy()[0, 1:])
    print("---- sample ----\n" + text + "\n----------------", flush=True)
