"""The language-model training loop shared by the GPT-2 and LLaMA-3 examples: InfiniTrain's
flags, llm.c's data order, one log line per step:

    step    1/10 | train loss 10.996094 | lr 1.00e-04 | (123.45 ms | 1234 tok/s | MFU 21.3% | peak used:   512 MB | DP=1, TP=1, SP=0, PP=1)
"""
from __future__ import annotations

import sys
import time
from contextlib import nullcontext

import infinitrain as it
from infinitrain import profiler
from infinitrain.plot import plot_losses
from infinitrain.precision_checker import PrecisionCheckConfig, PrecisionChecker
from infinitrain.profiler import record_function
from infinitrain.amp import autocast
from infinitrain.checkpoint import (CheckpointError, ensure_writable, load_checkpoint, load_lora,
                                    read_lora_config, save_checkpoint, save_lora)
from infinitrain.data import Tokenizer, TokenLoader
from infinitrain.data.prepare import shakespeare_files
from infinitrain.examples import mfu
from infinitrain.nn import parallel
from infinitrain.nn.lora import apply_lora
from infinitrain.nn.parallel.pp import PipelineParallel
from infinitrain.nn.parallel.zero import ZeroOptimizer
from infinitrain.nn.parallel.tensor_parallel import TensorParallel, allreduce_sequence_parallel_grads
from infinitrain.nn.utils import clip_grad_norm_
from infinitrain.optim import AdamW
from infinitrain.optim.lr_scheduler import ConstantLR, WarmupConstantLR


def train(args, build_model) -> int:
    """Trains build_model(args) (a GPT-2 or LLaMA-3 style model) as the flags say, on as many
    data-parallel MPI ranks as the job has."""
    schedule = args.pipeline_schedule or ("interleaved" if args.virtual_pipeline_parallel > 1 else "1f1b")
    if schedule == "interleaved" and args.virtual_pipeline_parallel < 2:
        sys.exit("--pipeline_schedule interleaved needs --virtual_pipeline_parallel 2 or more")
    if schedule == "1f1b" and args.virtual_pipeline_parallel > 1:
        sys.exit("--pipeline_schedule 1f1b runs one chunk per stage; with --virtual_pipeline_parallel "
                 "> 1 use interleaved (the default) or gpipe")
    pipelined = args.pipeline_parallel > 1 or args.virtual_pipeline_parallel > 1
    try:
        it.device(args.device)  # a malformed name, before MPI starts
    except (TypeError, ValueError) as e:
        sys.exit(f"--device {args.device}: {e}")
    try:
        env = parallel.init(args.tensor_parallel, args.pipeline_parallel, device=args.device)
    except ValueError as e:
        sys.exit(f"cannot lay out the job: {e}")
    except (RuntimeError, it.NativeError) as e:  # no GPU, no driver, no NCCL: what is missing
        sys.exit(f"--device {args.device}: {e}")
    device = env.device  # cuda:k, k this rank's place on its node
    dp, main = env.layout.dp, env.is_main
    tp = TensorParallel(env.tp_group, args.sequence_parallel) if args.tensor_parallel > 1 else None
    if args.zero_stage == 3 and pipelined:
        sys.exit("--zero_stage 3 does not compose with --pipeline_parallel yet (stages 1 and 2 do)")
    stage = env.pipeline_stage(args.virtual_pipeline_parallel) if pipelined else None
    if args.sequence_parallel and tp is None and main:
        print("note: --sequence_parallel has no effect without --tensor_parallel > 1", flush=True)
    layout = env.layout.describe(sequence_parallel=tp is not None and tp.sequence_parallel)
    if args.virtual_pipeline_parallel > 1:
        layout += f", VPP={args.virtual_pipeline_parallel}"
    log = print if main else (lambda *a, **k: None)
    B, T = args.batch_size, args.sequence_length
    tokens_per_micro = B * T * dp
    total = args.total_batch_size or tokens_per_micro
    if total % tokens_per_micro:
        sys.exit(f"--total_batch_size {total} is not a multiple of batch_size * sequence_length "
                 f"* data-parallel ranks = {B} * {T} * {dp} = {tokens_per_micro}")
    accum = total // tokens_per_micro

    if args.input_bin is None:
        if main:  # one rank prepares the data, the others wait for it
            shakespeare_files()
        env.world.barrier()
        files = shakespeare_files(prepare=False)
        args.input_bin = str(files["train"])
        args.input_val_bin = args.input_val_bin or str(files["val"])
        args.tokenizer_bin = args.tokenizer_bin or str(files["tokenizer"])

    plan = memory_plan(args, env, accum)
    if plan is not None:
        need, have, text = plan
        log(text, flush=True)
        if need > have:
            sys.exit(f"this job will not fit in memory: {text}. Use a smaller --model, fewer ranks "
                     "per node, --tensor_parallel / --pipeline_parallel to split the model over ranks, "
                     "or a smaller --batch_size / --sequence_length")

    it.manual_seed(args.seed)
    try:
        model = build_model(args, tp, stage)
    except ValueError as e:  # a layout that does not divide the model
        sys.exit(f"cannot build the model in this layout ({layout}): {e}")
    model.set_recompute(args.recompute)
    if args.lora_rank or args.lora_load_path:
        setup_lora(model, args, log)
    model.to(device)  # built and initialised on the host: every device starts from the same weights
    cfg = model.config
    if T > cfg.block_size:
        sys.exit(f"--sequence_length {T} exceeds the model's block size {cfg.block_size}")
    if tp is not None and tp.sequence_parallel and T % tp.size:
        sys.exit(f"--sequence_parallel splits the sequence over {tp.size} tensor-parallel ranks: "
                 f"--sequence_length {T} must be a multiple of {tp.size}")
    padded = getattr(cfg, "padded_vocab_size", cfg.vocab_size)
    log(f"model: {type(model).__name__} {args.llmc_filepath or args.model} | {cfg.n_layer} layers, "
          f"{cfg.n_head} heads, {cfg.n_embd} wide, vocab {cfg.vocab_size} (padded {padded}) | "
          f"{model.num_parameters():,} parameters{' on this rank' if tp or stage else ''} | {layout}", flush=True)
    log(f"batch: {B} x {T} tokens x {accum} {'micro-batches' if stage else 'accumulation steps'} x "
        f"{dp} data-parallel ranks = {total} tokens per step | {it.get_num_threads()} threads per rank",
        flush=True)
    if stage is not None:
        log(f"pipeline: {schedule} schedule over {args.pipeline_parallel} stages x "
            f"{args.virtual_pipeline_parallel} chunks, layers per chunk {[len(c) for c in model.stage_layers]} "
            f"on stage 0", flush=True)

    if args.peak_tflops:
        peak = args.peak_tflops * 1e12
        log(f"MFU against a peak of {peak / 1e9:.1f} GFLOP/s per rank (--peak_tflops)", flush=True)
    else:
        peak = mfu.measure_peak_flops(args.dtype, env.world, device)
        t = it.tensor([peak], dtype=it.float64, device=device)
        env.world.all_reduce(t, parallel.ReduceOp.AVG)
        peak = t.item()
        log(f"MFU against a peak of {peak / 1e9:.1f} GFLOP/s per rank (measured: {args.dtype} matrix products "
            f"on all {env.world.size} ranks at once; --peak_tflops gives one)", flush=True)
    step_flops = mfu.flops_per_token(type(model)._llmc_numel(cfg), cfg.n_layer, cfg.n_embd, T) * total
    curves = {"train": [], "val": []}

    rank = env.dp_rank
    train = TokenLoader(args.input_bin, B, T, rank, dp, vocab_size=cfg.vocab_size, device=device)
    val = TokenLoader(args.input_val_bin, B, T, rank, dp, vocab_size=cfg.vocab_size, device=device) \
        if args.input_val_bin else None
    zero = args.zero_stage > 0 and dp > 1  # ZeRO does the DP reduction instead of DDP
    zero3 = zero and args.zero_stage == 3  # the model runs only with every DP rank along
    pipe = PipelineParallel(model, schedule, None if zero else env.dp_group, args.pipeline_timeout) \
        if stage else None
    net = parallel.DistributedDataParallel(model) if dp > 1 and pipe is None and not zero else model
    forward_context = lambda: autocast(args.dtype, enabled=args.dtype != "float32")  # noqa: E731
    tokenizer = Tokenizer(args.tokenizer_bin) if args.tokenizer_bin else None

    decay = [p for p in model.parameters() if p.ndim >= 2 and p.requires_grad]
    no_decay = [p for p in model.parameters() if p.ndim < 2 and p.requires_grad]
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if zero:
        optimizer = ZeroOptimizer(groups, AdamW, env.dp_group, stage=args.zero_stage, module=model,
                                  lr=args.learning_rate, betas=(0.9, 0.95), eps=1e-8)
    else:
        optimizer = AdamW(groups, lr=args.learning_rate, betas=(0.9, 0.95), eps=1e-8)
    lr_schedule = WarmupConstantLR(optimizer, args.warmup_iters, args.num_iteration) \
        if args.warmup_iters else ConstantLR(optimizer)

    first = 1
    prof = profiler.profile()
    if args.load:
        try:
            meta = load_checkpoint(args.load, model, optimizer)
            train.load_state(meta["extra"]["train_loader"])
            lr_schedule.load_state_dict(meta["extra"]["schedule"])
        except CheckpointError as e:
            sys.exit(f"cannot resume: {e}")
        except (KeyError, TypeError, ValueError) as e:
            sys.exit(f"cannot resume from {args.load}: its data-loader or schedule state is missing "
                     f"or damaged ({type(e).__name__}: {e})")
        first = meta["step"] + 1
        if first > args.num_iteration:
            sys.exit(f"{args.load} is at step {meta['step']}: --num_iteration {args.num_iteration} "
                     "leaves nothing to train; raise --num_iteration to train further")
        log(f"resumed from {args.load} at step {meta['step']}", flush=True)
    for flag, folder in (("--save", args.save), ("--lora_save_path", args.lora_save_path)):
        try:  # every output is checked before training, not after it
            if folder:
                ensure_writable(folder)
        except CheckpointError as e:
            sys.exit(f"{flag}: {e}")
    for flag, path in (("--profile", args.profile), ("--plot", args.plot)):
        if path:
            check_writable_file(flag, path)
    profiling = ProfileWindow(args.profile, first, args.num_iteration, args.profile_steps)
    checker = None
    if args.precision_check:
        try:
            checker = PrecisionChecker(model, PrecisionCheckConfig.parse(args.precision_check), rank=env.rank,
                                       world=env.world.size, dp=(env.dp_rank, dp))
        except ValueError as e:
            sys.exit(str(e))
        except OSError as e:
            sys.exit(f"--precision_check: cannot write to its output_path: {e.strerror or e} ({e.filename})")

    def save(step: int) -> None:
        # the files hold one-process tensors: TP shards are gathered, and each pipeline stage of
        # DP rank 0 writes its layers (its TP rank 0 does)
        if env.coords.dp == 0 or zero:  # ZeRO: every DP rank holds a shard of the state
            path = save_checkpoint(args.save, step, model, optimizer,
                                   extra={"train_loader": train.state(), "schedule": lr_schedule.state_dict()},
                                   keep=args.max_checkpoint_keep or None,
                                   write=env.coords.tp == 0 and env.coords.dp == 0)
            log(f"saved {path}", flush=True)
        env.world.barrier()

    for step in range(first, args.num_iteration + 1):
        if val is not None and args.val_loss_every and (step == 1 or step % args.val_loss_every == 0):
            curves["val"].append((step - 1, evaluate(model, val, args.val_max_steps, env, pipe)))  # after step - 1
            log(f"val loss {curves['val'][-1][1]:.6f}", flush=True)
        if tokenizer is not None and args.sample_every and step % args.sample_every == 0:
            sample(model, tokenizer, args, env, pipe, every_dp_rank=zero3)

        if profiling.starts(step):
            prof.__enter__()
        it.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        lr = optimizer.param_groups[0]["lr"]
        if checker is not None:
            checker.begin_step(step)
        if pipe is not None:  # the accumulation steps are the pipeline's micro-batches
            with record_function("pipeline train_step"):
                step_loss = pipe.train_step([train.next_batch() for _ in range(accum)], forward_context)
        else:
            loss_sum = None  # summed where the loss is: on a GPU the host does not wait per micro-batch
            for micro in range(accum):
                x, y = train.next_batch()
                last = micro == accum - 1
                with (net.no_sync() if dp > 1 and not last and not zero else nullcontext()):
                    with forward_context(), record_function("forward"):
                        _, loss = net(x, y, return_logits=False)
                    with record_function("backward"):
                        (loss / accum if accum > 1 else loss).backward()
                part = loss.detach().double()
                loss_sum = part if loss_sum is None else loss_sum + part
            step_loss = loss_sum.item() / accum
        if checker is not None:
            checker.end_step()
        with record_function("optimizer step"):
            allreduce_sequence_parallel_grads(model)  # SP: norms/biases saw a part of the sequence
            if args.grad_clip > 0 and zero:  # over every rank's gradient shard
                optimizer.clip_grad_norm_(args.grad_clip, pipeline_group=env.pp_group)
            elif args.grad_clip > 0:  # one norm over every stage's parameters, as one process's
                clip_grad_norm_(model.parameters(), args.grad_clip, pipeline_group=env.pp_group)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        lr_schedule.step()
        if device.type == "cuda":
            it.cuda.synchronize(device)  # the step's kernels are queued, not done
        ms = (time.perf_counter() - t0) * 1e3
        mean_loss = dp_mean(step_loss, env)
        peak_mb = it.memory_stats(device)["peak_allocated_bytes"] // 2**20
        utilisation = step_flops / (ms / 1e3) / (peak * env.world.size)
        curves["train"].append((step, mean_loss))
        log(f"step {step:4d}/{args.num_iteration} | train loss {mean_loss:.6f} | lr {lr:.2e} | "
            f"({ms:.2f} ms | {total / ms * 1e3:.0f} tok/s | MFU {100 * utilisation:.1f}% | "
            f"peak used: {peak_mb:5d} MB | {layout})", flush=True)
        if profiling.ends(step):
            prof.__exit__(None, None, None)
            profiling.report(prof, env, log)
        if args.save and args.save_interval and step % args.save_interval == 0:
            save(step)

    if args.save and not (args.save_interval and args.num_iteration % args.save_interval == 0):
        save(args.num_iteration)
    if checker is not None:
        print(checker.close(), flush=True)
    if args.lora_save_path:
        save_lora(model, args.lora_save_path, write=env.coords.dp == 0 and env.coords.tp == 0, optimizer=optimizer)
        env.world.barrier()
        log(f"saved LoRA adapters to {args.lora_save_path}", flush=True)
    if val is not None and args.val_loss_every:
        curves["val"].append((args.num_iteration, evaluate(model, val, args.val_max_steps, env, pipe)))
        log(f"val loss {curves['val'][-1][1]:.6f}", flush=True)
    if args.plot and env.is_main:
        try:
            plot_losses({type(model).__name__: curves}, args.plot, f"{type(model).__name__} {layout}")
            log(f"wrote the loss curves to {args.plot}", flush=True)
        except (RuntimeError, ValueError, OSError) as e:
            print(f"could not draw {args.plot}: {e}", file=sys.stderr, flush=True)
    if tokenizer is not None and args.sample_every:
        sample(model, tokenizer, args, env, pipe, every_dp_rank=zero3)
    return 0


def check_writable_file(flag: str, path) -> None:
    """Exits with a message unless a file can be written at path (its folder must exist)."""
    import os
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        sys.exit(f"{flag} {path}: the folder {folder} does not exist or is not writable")


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


def memory_plan(args, env, micro_batches: int):
    """(bytes this node's ranks will need, bytes available, a line saying so), estimated before
    anything is built: per parameter 4 bytes of weights, 4 of gradient and 8 of AdamW moments
    (+2 for bfloat16 copies), split over TP x PP, and ZeRO's shares over DP; activations of the micro-batches a stage
    holds (all M under GPipe, up to PP under 1F1B) at about 24 B T C floats per layer plus the
    attention scores, the logits and their gradient on the last stage, and ~350 MB for the
    process itself (Python, numpy, MPI, BLAS buffers, the data). None if unknown."""
    known = _config_of(args)
    if known is None or env.device.type != "cpu":  # this is the host's memory
        return None
    try:
        with open("/proc/meminfo") as f:
            available = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None
    cfg, cls = known
    L = env.layout
    params = cls._llmc_numel(cfg) / (L.tp * L.pp)
    weights, grads, moments = 4, 4, (10 if args.dtype == "bfloat16" else 8)
    stage = args.zero_stage if L.dp > 1 else 0
    state = params * (weights / (L.dp if stage >= 3 else 1) + grads / (L.dp if stage >= 2 else 1)
                      + moments / (L.dp if stage >= 1 else 1))
    B, T, C = args.batch_size, args.sequence_length, cfg.n_embd
    held = micro_batches if L.pp == 1 or args.pipeline_schedule == "gpipe" else min(micro_batches, L.pp)
    per_layer = 4 * (24 * B * T * C / L.tp + 2 * B * (cfg.n_head / L.tp) * T * T)
    vocab = getattr(cfg, "padded_vocab_size", cfg.vocab_size)
    acts = held * per_layer * cfg.n_layer / L.pp + 2 * 4 * B * T * vocab / L.tp
    per_rank = state + acts + 350 * 2**20
    need = per_rank * env.local_size
    text = (f"memory: about {per_rank / 2**30:.2f} GB per rank ({params / 1e6:.1f}M parameters with "
            f"gradients and AdamW state, activations of {held} micro-batch(es)) x {env.local_size} "
            f"rank(s) on this node = {need / 2**30:.1f} GB of {available / 2**30:.1f} GB available")
    return need, available, text


def dp_mean(value: float, env) -> float:
    """The mean of a per-rank number over the data-parallel ranks."""
    if env.layout.dp == 1:
        return value
    t = it.tensor([value], dtype=it.float32, device=env.device)
    env.dp_group.all_reduce(t, parallel.ReduceOp.AVG)
    return t.item()


@it.no_grad()
def evaluate(model, loader, max_steps: int, env, pipe=None) -> float:
    model.eval()
    loader.reset()
    steps = max(1, min(max_steps, len(loader.shards[0]) // (loader.B * loader.T * loader.world)))
    total = 0.0
    for _ in range(steps):
        x, y = loader.next_batch()
        total += pipe.eval_step([(x, y)]) if pipe is not None else model(x, y, return_logits=False)[1].item()
    model.train()
    return dp_mean(total / steps, env)


def sample(model, tokenizer, args, env, pipe=None, every_dp_rank: bool = False) -> None:
    """The main rank prints a sample; the ranks holding the rest of its model (its TP group
    and pipeline stages: DP rank 0; under ZeRO-3 every DP rank) run the model along."""
    if env.coords.dp != 0 and not every_dp_rank:
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

