"""The language-model training loop shared by the GPT-2 and LLaMA-3 examples: InfiniTrain's
flags, llm.c's data order, one log line per step:

    step    1/10 | train loss 10.996094 | lr 1.00e-04 | (123.45 ms | 1234 tok/s | MFU 21.3% | peak used:   512 MB | DP=1, TP=1, SP=0, PP=1)
"""
from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path

import infinitrain as it
from infinitrain import profiler
from infinitrain.plot import plot_losses
from infinitrain.precision_checker import PrecisionCheckConfig, PrecisionChecker
from infinitrain.amp import autocast
from infinitrain.checkpoint import (CheckpointError, load_checkpoint, load_lora,
                                    read_lora_config, resolve, save_checkpoint, save_checkpoint_async, save_lora)
from infinitrain.data import DataFormatError, Tokenizer, TokenLoader, read_shard
from infinitrain.examples.flags import check_input_files, check_outputs, plan_of, refuse
from infinitrain.io import input_file
from infinitrain.data.prepare import on_every_node, shakespeare_files
from infinitrain.examples import mfu
from infinitrain.nn import parallel
from infinitrain.nn.lora import apply_lora
from infinitrain.nn.parallel.memory_plan import memory_plan
from infinitrain.nn.parallel.train_step import TrainStep, decay_groups
from infinitrain.optim import AdamW
from infinitrain.optim.offload import OffloadError
from infinitrain.optim.lr_scheduler import ConstantLR, WarmupConstantLR


def train(args, build_model) -> int:
    """Trains build_model(args, tp, stage, cp) (a GPT-2 or LLaMA-3 style model) as the flags say,
    on as many MPI ranks as the job has: set up the layout, build and wrap the model, train, finish."""
    env, plan = setup_plan(args)
    log = print if env.is_main else (lambda *a, **k: None)
    resume_from_save(args, log)
    accum = accumulation_steps(args, plan)
    prepare_data(args, env)
    check_inputs(args, env)
    check_memory(args, plan, env.local_size, accum, log)
    model = build(args, env, plan, build_model, log)
    try:
        trainer = TrainStep(model, plan, decay_groups(model, args.weight_decay), AdamW,
                            pipeline_timeout=args.pipeline_timeout, lr=args.learning_rate, betas=(0.9, 0.95), eps=1e-8)
    except OffloadError as e:  # the disk, found too small (or failing) when its space is reserved
        sys.exit(f"rank {env.rank}: {e}")
    log_setup(args, env, plan, model, accum, log)
    if trainer.offloaded is not None:
        log(f"offload: {trainer.offloaded} per rank", flush=True)
    loop = TrainingLoop(args, env, plan, model, trainer, accum, log)
    try:
        loop.run()
    except KeyboardInterrupt:  # Ctrl-C (SIGINT reaches every rank): one line, from rank 0
        if env.is_main:
            saved = f"; the last complete checkpoint is {resolve(args.save)}" if args.save and \
                (Path(args.save) / "latest").is_file() else ""
            print(f"interrupted at step {loop.current_step}{saved}", file=sys.stderr, flush=True)
        return 130
    loop.finish()
    return 0


def setup_plan(args):
    """Starts MPI and the process groups, and lays out the job as the flags say: (env, the
    ParallelPlan, which refuses flags that cannot work together)."""
    try:
        device = it.device(args.device)  # a malformed name, before MPI starts
    except (TypeError, ValueError) as e:
        refuse(f"--device {args.device}: {e}")
    if device.type == "cpu" and device.index not in (None, 0):
        refuse(f"--device {args.device}: there is one CPU device, cpu (each rank uses its share of its node's cores)")
    try:
        env = parallel.init(args.tensor_parallel, args.pipeline_parallel, device=args.device,
                            context_parallel=args.context_parallel, collective_timeout=args.collective_timeout,
                            flight_recorder_dir=args.flight_recorder_dir)
    except ValueError as e:
        refuse(f"cannot lay out the job: {e}")
    except (RuntimeError, it.NativeError) as e:  # no GPU, no driver, no NCCL: what is missing
        refuse(f"--device {args.device}: {e}")
    plan = make_plan(args, env)
    if args.sequence_parallel and plan.tp == 1 and env.is_main:
        print("note: --sequence_parallel has no effect without --tensor_parallel > 1", flush=True)
    if plan.zero_has_no_effect and env.is_main:
        print(f"note: --zero_stage {args.zero_stage} has no effect with one data-parallel rank (there is nothing "
              "to shard the optimizer state over); it trains as without ZeRO", flush=True)
    return env, plan


def make_plan(args, env):
    """The ParallelPlan of the flags (flags.plan_of: refused, once, where they cannot work together)."""
    return plan_of(env, sequence_parallel=args.sequence_parallel,
                   virtual_pipeline_parallel=args.virtual_pipeline_parallel,
                   pipeline_schedule=args.pipeline_schedule, pipeline_split=args.pipeline_split,
                   cp_comm=args.cp_comm, zero_stage=args.zero_stage, offload_optimizer=args.offload_optimizer,
                   offload_param=args.offload_param, offload_path=args.offload_path, recompute=args.recompute,
                   async_tensor_parallel=not args.no_async_tensor_model_parallel_allreduce)


def restart_count() -> int:
    """Which restart of the job this is (0: the first launch): mpi_launch --max_restarts sets
    torchrun's TORCHELASTIC_RESTART_COUNT."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def resume_from_save(args, log) -> None:
    """--resume auto (the default under mpi_launch --max_restarts): without --load, resume from
    --save's latest checkpoint when there is one. A resumed job keeps the checkpoint's global
    batch unless --total_batch_size says otherwise, so that a job restarted at another size
    (more accumulation steps when DP shrinks) continues the same run."""
    resume = args.resume or ("auto" if os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") not in ("", "0") else "never")
    args.auto_resumed = False
    if resume == "auto" and not args.load and args.save and (Path(args.save) / "latest").is_file():
        args.load, args.auto_resumed = args.save, True
    if args.load:
        try:
            from infinitrain.checkpoint import read_meta
            meta = read_meta(args.load)
        except CheckpointError as e:
            sys.exit(f"cannot resume: {e}")
        saved = meta.get("extra", {}).get("total_batch_size")
        if not args.total_batch_size and saved:
            args.total_batch_size = int(saved)
        if restart_count():
            log(f"restart {restart_count()}: resuming from {args.load} at step {meta['step']}", flush=True)


def accumulation_steps(args, plan) -> int:
    """Micro-batches per step: --total_batch_size over what one micro-batch of every DP rank
    holds (args.total_batch_size is set to the step's tokens when the flag left it 0)."""
    B, T, dp = args.batch_size, args.sequence_length, plan.dp
    tokens_per_micro = B * T * dp
    total = args.total_batch_size or tokens_per_micro
    if total % tokens_per_micro:
        refuse(f"--total_batch_size {total} is not a multiple of batch_size * sequence_length "
                 f"* data-parallel ranks = {B} * {T} * {dp} = {tokens_per_micro}")
    args.total_batch_size = total
    return total // tokens_per_micro


def prepare_data(args, env) -> None:
    """Without --input_bin: Shakespeare, prepared once per job (or per node: on_every_node)."""
    if args.input_bin is not None:
        return
    files = on_every_node(env, shakespeare_files)
    args.input_bin = str(files["train"])
    args.input_val_bin = args.input_val_bin or str(files["val"])
    args.tokenizer_bin = args.tokenizer_bin or str(files["tokenizer"])


def check_inputs(args, env) -> None:
    """The data, tokenizer and checkpoint files the flags name, opened on rank 0 first."""
    check_input_files(env, [("--input_bin", args.input_bin, read_shard),
                            ("--input_val_bin", args.input_val_bin, read_shard),
                            ("--tokenizer_bin", args.tokenizer_bin, Tokenizer),
                            ("--llmc_filepath", args.llmc_filepath, lambda p: input_file(p, "checkpoint"))])


def check_sequence_length(args, block_size: int) -> None:
    if args.sequence_length > block_size:
        refuse(f"--sequence_length {args.sequence_length} exceeds the model's block size {block_size}")


def check_memory(args, plan, local_size: int, accum: int, log) -> None:
    """The memory plan's estimate (nn.parallel.memory_plan), logged; a job that would not fit
    is refused with the ZeRO stage or the offload that would make it fit, if one would."""
    known = _config_of(args)  # a sequence the model cannot take is that, not a memory problem
    if known is None:
        return
    check_sequence_length(args, known[0].block_size)

    def estimate(p):
        return memory_plan(p, *known, args.batch_size, args.sequence_length, accum, args.dtype, local_size)

    def variant(**changes):  # the plan with other options, or None where they cannot work together
        try:
            return plan.with_options(**changes)
        except ValueError:
            return None
    planned = estimate(plan)
    if planned is None:
        return
    need, have, text, parts = planned
    log(text, flush=True)
    if "on disk" in parts:  # the scratch files of this node's ranks, reserved when they are made
        disk = parts["on disk"] * local_size
        st = os.statvfs(plan.offload_path)
        if disk > st.f_bavail * st.f_frsize:
            what = "the AdamW state and the parameters need" if plan.offload_param else "the AdamW state needs"
            refuse(f"--offload_path {plan.offload_path}: {what} {disk / 2**30:.2f} GB there and "
                   f"{st.f_bavail * st.f_frsize / 2**30:.2f} GB are free: free space or name a bigger disk")
    if need <= have:
        return
    ways = ""
    if plan.dp_cp > 1 and plan.zero_stage < 3:
        fitting = [s for s in range(plan.zero_stage + 1, 4)
                   if (v := variant(zero_stage=s)) is not None and estimate(v)[0] <= have]
        if fitting:
            ways = f"--zero_stage {fitting[0]} (it would fit), "
    if not ways and plan.offload_param is None:
        path = plan.offload_path or "DIR"
        offloaded = variant(offload_optimizer="nvme", offload_path=path)
        offloaded = estimate(offloaded) if offloaded is not None else None
        both = variant(zero_stage=3, offload_optimizer="nvme", offload_param="nvme", offload_path=path)
        both = estimate(both) if both is not None else None
        if "on disk" not in parts and offloaded is not None and offloaded[0] <= have:
            ways = (f"--offload_optimizer nvme --offload_path DIR (it would fit, with "
                    f"{offloaded[3]['on disk'] * local_size / 2**30:.1f} GB of AdamW state on that disk), ")
        elif both is not None and both[0] <= have:
            ways = (f"--zero_stage 3 --offload_optimizer nvme --offload_param nvme --offload_path DIR (it would "
                    f"fit, with {both[3]['on disk'] * local_size / 2**30:.1f} GB of AdamW state and "
                    "parameters on that disk), ")
    sys.exit(f"this job will not fit in memory: {text}. Use {ways}a smaller --model, fewer ranks "
             "per node, --tensor_parallel / --pipeline_parallel to split the model over ranks, "
             "or a smaller --batch_size / --sequence_length")


def build(args, env, plan, build_model, log):
    """The model of this rank's layout, with recomputation and LoRA as asked, on its device."""
    it.manual_seed(args.seed)
    try:
        model = build_model(args, plan.tensor_parallel(), plan.pipeline_stage(), plan.context_parallel())
    except (DataFormatError, OSError) as e:  # the checkpoint's contents (its header passed check_inputs)
        sys.exit(f"--llmc_filepath: {e}")
    except ValueError as e:  # a layout that does not divide the model
        refuse(f"cannot build the model in this layout ({plan.describe()}): {e}")
    model.set_recompute(plan.recompute)
    if args.lora_rank or args.lora_load_path:
        setup_lora(model, args, log)
    model.to(env.device)  # built and initialised on the host: every device starts from the same weights
    T = args.sequence_length
    check_sequence_length(args, model.config.block_size)  # (an llm.c file's, known only now)
    try:
        model.check_batch(it.zeros(1, T, dtype=it.int64))  # CP and SP split the sequence evenly
    except ValueError as e:
        refuse(f"--sequence_length {T}: {e}")
    return model


def log_setup(args, env, plan, model, accum: int, log) -> None:
    cfg = model.config
    padded = getattr(cfg, "padded_vocab_size", cfg.vocab_size)
    split = plan.tp > 1 or plan.pipelined
    log(f"model: {type(model).__name__} {args.llmc_filepath or args.model} | {cfg.n_layer} layers, "
        f"{cfg.n_head} heads, {cfg.n_embd} wide, vocab {cfg.vocab_size} (padded {padded}) | "
        f"{model.num_parameters():,} parameters{' on this rank' if split else ''} | {plan.describe()}", flush=True)
    log(f"batch: {args.batch_size} x {args.sequence_length} tokens x {accum} "
        f"{'micro-batches' if plan.pipelined else 'accumulation steps'} x {plan.dp} data-parallel ranks = "
        f"{args.total_batch_size} tokens per step | {it.get_num_threads()} threads per rank", flush=True)
    if plan.pipelined:
        log(f"pipeline: {plan.pipeline_schedule} schedule over {plan.pp} stages x "
            f"{plan.virtual_pipeline_parallel} chunks, layers per chunk {[len(c) for c in model.stage_layers]} "
            f"on stage 0", flush=True)


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
        self.peak = peak_flops(args, env, log)
        self.step_flops = mfu.flops_per_token(type(model)._llmc_numel(cfg), cfg.n_layer, cfg.n_embd, T) \
            * args.total_batch_size
        self.curves = {"train": [], "val": []}
        dp, rank = plan.dp, plan.coords.dp
        self.train_data = TokenLoader(args.input_bin, B, T, rank, dp, vocab_size=cfg.vocab_size, device=device)
        self.val_data = TokenLoader(args.input_val_bin, B, T, rank, dp, vocab_size=cfg.vocab_size, device=device) \
            if args.input_val_bin else None
        self.forward_context = lambda: autocast(args.dtype, enabled=args.dtype != "float32")  # noqa: E731
        self.tokenizer = Tokenizer(args.tokenizer_bin) if args.tokenizer_bin else None
        self.lr_schedule = WarmupConstantLR(self.optimizer, args.warmup_iters, args.num_iteration) \
            if args.warmup_iters else ConstantLR(self.optimizer)
        self.first = self.resume() + 1
        self.current_step = self.first
        self.check_outputs()
        self.pending_save = None  # an --async_save in flight
        self.prof = profiler.profile()
        self.profiling = ProfileWindow(args.profile, self.first, args.num_iteration, args.profile_steps)
        self.checker = self.precision_checker()

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
        if meta["step"] + 1 > args.num_iteration and args.auto_resumed:  # a restart after the last save
            self.log(f"{args.load} is at step {meta['step']}: training was complete", flush=True)
            return meta["step"]
        if meta["step"] + 1 > args.num_iteration:
            refuse(f"{args.load} is at step {meta['step']}: --num_iteration {args.num_iteration} "
                     "leaves nothing to train; raise --num_iteration to train further")
        self.log(f"resumed from {args.load} at step {meta['step']}", flush=True)
        return meta["step"]

    def check_outputs(self) -> None:
        """Every output is checked before training, not after it."""
        args = self.args
        check_outputs(folders=[("--save", args.save), ("--lora_save_path", args.lora_save_path)],
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
            result = save(args.save, step, self.model, self.optimizer,
                          extra={"train_loader": self.train_data.state(),
                                 "schedule": self.lr_schedule.state_dict(),
                                 "total_batch_size": args.total_batch_size},
                          keep=args.max_checkpoint_keep or None,
                          write=self.plan.writes_files)
            fail_for_tests(env.rank, step, saving=True)
            if args.async_save:
                self.pending_save = result
                self.log(f"saving {Path(args.save) / f'step_{step:06d}'} in the background", flush=True)
            else:
                self.log(f"saved {result}", flush=True)
        if not args.async_save:
            env.world.barrier()

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

    def run(self) -> None:
        args = self.args
        for step in range(self.first, args.num_iteration + 1):
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
        loss = self.trainer.forward_backward(batches, self.forward_context)
        if self.checker is not None:
            self.checker.end_step()
        self.stop_if_not_finite(step, "loss", loss)  # before the step writes it into the weights
        norm = self.trainer.optimizer_step(args.grad_clip)
        if norm is not None:
            self.stop_if_not_finite(step, "gradient norm", norm)
        self.lr_schedule.step()
        if device.type == "cuda":
            it.cuda.synchronize(device)  # the step's kernels are queued, not done
        ms = (time.perf_counter() - t0) * 1e3
        peak_mb = it.memory_stats(device)["peak_allocated_bytes"] // 2**20
        achieved = self.step_flops / (ms / 1e3) / env.world.size  # FLOP/s per rank
        if achieved > self.peak:  # the peak was measured on a busy machine, or given too low
            self.log(f"note: step {step} ran at {achieved / 1e9:.1f} GFLOP/s per rank, above the "
                     f"{self.peak / 1e9:.1f} the MFU is measured against; that is the peak from now on", flush=True)
            self.peak = achieved
        utilisation = achieved / self.peak
        self.curves["train"].append((step, loss))
        self.log(f"step {step:4d}/{args.num_iteration} | train loss {loss:.6f} | lr {lr:.2e} | "
                 f"({ms:.2f} ms | {args.total_batch_size / ms * 1e3:.0f} tok/s | MFU {100 * utilisation:.1f}% | "
                 f"peak used: {peak_mb:5d} MB | {self.layout})", flush=True)

    def stop_if_not_finite(self, step: int, what: str, value: float) -> None:
        """Megatron's check_for_nan_in_loss_and_grad (on by default): a NaN or infinite loss or
        gradient norm ends the run with a message instead of training on garbage. The value is
        the same on every rank (a mean over the job), so every rank stops here together."""
        if not self.args.check_for_nan_in_loss_and_grad or math.isfinite(value):
            return
        found = [f for f in self.env.comm.gather(self.first_not_finite(), root=0) or [] if f]
        if self.env.is_main:
            where = (f"the first tensor that is not: {found[0]}" if found else
                     "every weight and gradient is finite, so an activation overflowed (--precision_check "
                     "level=1 names the first module whose output is not finite)")
            print(f"step {step}: the {what} is {value}; {where}. Training diverged (or the data or weights "
                  "hold NaN/inf): lower --learning_rate or set --grad_clip; "
                  "--no_check_for_nan_in_loss_and_grad trains on regardless", file=sys.stderr, flush=True)
        sys.exit(1)

    def first_not_finite(self) -> str | None:
        """This rank's first parameter or gradient, in model order, holding a NaN or inf (read
        only once the run has failed: a pass over every tensor)."""
        import numpy as np
        for name, p in self.model.named_parameters():
            for label, t in ((name, p), (f"{name}.grad", p.grad)):
                if t is not None and t.numel() and not np.isfinite(t.detach().float().cpu().numpy()).all():
                    return f"{label} (rank {self.env.rank})"
        return None

    def finish(self) -> None:
        """The last checkpoint, adapters, evaluation, plot and sample."""
        args, env, model = self.args, self.env, self.model
        if args.save and not (args.save_interval and args.num_iteration % args.save_interval == 0):
            self.save(args.num_iteration)
        self.finish_save(block=True)
        if self.checker is not None:
            for line in self.checker.close().splitlines():  # a line per write: ranks' lines stay whole
                print(line, flush=True)
        if args.lora_save_path:
            save_lora(model, args.lora_save_path, write=self.plan.writes_files,
                      optimizer=self.optimizer)
            env.world.barrier()
            self.log(f"saved LoRA adapters to {args.lora_save_path}", flush=True)
        if self.val_data is not None and args.val_loss_every:
            self.evaluate(args.num_iteration)
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
            self.log(f"offload (rank 0): read {store.bytes_read / 2**30:.2f} GB, wrote {store.bytes_written / 2**30:.2f} GB "
                     f"in {store.io_seconds:.1f} s of background I/O; the optimizer waited {store.waited:.1f} s for it",
                     flush=True)
        elif offloaded is not None:
            how = (f"{offloaded.streamed_bytes / 2**20:.1f} MB of the last step's gradients streamed to it during "
                   "backward" if self.trainer.streaming is not None else
                   "the gradients copied to it at each step (a pipeline without DDP's reducers, on one DP rank or "
                   "under ZeRO, knows them final only when its whole schedule has run)")
            self.log(f"offload (rank 0): the AdamW state in host memory; {how}", flush=True)


def fail_for_tests(rank: int, step: int, saving: bool = False) -> None:
    """The tests' way to make a rank fail: INFINITRAIN_FAIL_AT="RANK:STEP:HOW[:always]" (HOW:
    kill, a SIGKILL; raise, an exception; stop, a SIGSTOP, at the start of that step;
    kill_in_save, a SIGKILL just after that step's checkpoint began to be written), on the
    first launch only (a restarted job must get past it) unless `always`."""
    spec = os.environ.get("INFINITRAIN_FAIL_AT")
    if not spec:
        return
    r, s, how, *always = spec.split(":")
    if (how == "kill_in_save") != saving:
        return
    if int(r) == rank and int(s) == step and (always or not restart_count()):
        if how == "raise":
            raise RuntimeError(f"INFINITRAIN_FAIL_AT: rank {rank} fails at step {step}")
        os.kill(os.getpid(), signal.SIGSTOP if how == "stop" else signal.SIGKILL)


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


def setup_lora(model, args, log) -> None:
    """Adapters as the flags say (or as the saved ones are), loaded if asked."""
    rank, alpha = args.lora_rank, args.lora_alpha
    targets = [t for t in args.lora_target_modules.split(",") if t]
    try:
        if args.lora_load_path:
            saved = read_lora_config(args.lora_load_path)
            rank = rank or saved["r"]
            alpha = alpha if alpha is not None else saved["lora_alpha"]
        names = apply_lora(model, rank, alpha, targets, seed=args.seed)
        if args.lora_load_path:
            load_lora(model, args.lora_load_path)
    except (ValueError, CheckpointError) as e:
        sys.exit(f"cannot set up LoRA: {e}")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log(f"LoRA: rank {rank}, alpha {model.lora_config['lora_alpha']:g} on {len(names)} layers "
        f"({', '.join(sorted({n.split('.', 3)[-1] for n in names}))}) | {trainable:,} trainable of "
        f"{model.num_parameters():,} parameters{' on this rank' if model.tp or model.pp else ''}"
        + (f" | adapters from {args.lora_load_path}" if args.lora_load_path else ""), flush=True)


def _config_of(args):
    """The model's configuration before it is built: the preset's, or an llm.c file's header."""
    from infinitrain.models import GPT2, LLaMA3, GPT2Config
    if args.llmc_filepath:
        return None
    cfg = args.presets[args.model]
    return cfg, (GPT2 if isinstance(cfg, GPT2Config) else LLaMA3)


@it.no_grad()
def evaluate(model, loader, max_steps: int, trainer) -> float:
    """The mean validation loss over max_steps batches (fewer if the split is short), over DP."""
    pipe = trainer.pipe
    model.eval()
    loader.reset()
    steps = max(1, min(max_steps, len(loader.shards[0]) // (loader.B * loader.T * loader.world)))
    total = 0.0
    for _ in range(steps):
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

