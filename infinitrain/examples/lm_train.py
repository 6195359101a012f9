"""The language-model training run shared by the GPT-2 and LLaMA-3 examples, InfiniTrain's
flags and llm.c's data order: this module sets the job up (MPI, the ParallelPlan of the flags,
data, inputs, the memory plan, the model with recomputation and LoRA, the TrainStep), and
lm_loop.py runs its steps, one log line each:

    step    1/10 | train loss 10.996094 | lr 1.00e-04 | (123.45 ms | 1234 tok/s | MFU 21.3% |
    peak used:   512 MB | peak reserved:   530 MB | DP=1, TP=1, SP=0, PP=1)          (one line)
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import infinitrain as it
from infinitrain.checkpoint import CheckpointError, load_lora, read_lora_config, resolve
from infinitrain.checkpoint.writer import newest_checkpoint
from infinitrain.data import DataFormatError, Tokenizer, read_shard
from infinitrain.data.loader import shard_files
from infinitrain.examples.flags import check_input_files, plan_of, refuse
from infinitrain.examples.ds_flags import COMMON, same, setter, take_deepspeed_config, typed_flags
from infinitrain.io import input_file
from infinitrain.data.prepare import on_every_node, shakespeare_files
from infinitrain.examples.lm_loop import TrainingLoop, restart_count
from infinitrain.nn import parallel
from infinitrain.nn.lora import DEFAULT_TARGETS, apply_lora
from infinitrain.nn.parallel.memory_plan import memory_plan
from infinitrain.nn.parallel.train_step import TrainStep, decay_groups
from infinitrain.runtime import check_fits_in_memory
from infinitrain.optim import AdamW
from infinitrain.optim.offload import OffloadError


def train(args, build_model) -> int:
    """Trains build_model(args, tp, stage, cp, ep) (a GPT-2 or LLaMA-3 style model) as the flags say,
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
                            pipeline_timeout=args.pipeline_timeout, grad_reduce_dtype=args.grad_reduce_dtype,
                            lr=args.learning_rate, betas=args.betas,
                            eps=args.eps)
    except OffloadError as e:  # the disk, found too small (or failing) when its space is reserved
        sys.exit(f"rank {env.rank}: {e}")
    log_setup(args, env, plan, model, accum, log)
    if trainer.offloaded is not None:
        log(f"offload: {trainer.offloaded} per rank", flush=True)
    loop = TrainingLoop(args, env, plan, model, trainer, accum, log)
    if args.eval_only:
        loop.evaluate_only()
        return 0
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
    if args.layout == "auto":
        auto_layout(args)
    try:
        env = parallel.init(args.tensor_parallel, args.pipeline_parallel, device=args.device,
                            context_parallel=args.context_parallel, expert_parallel=args.expert_parallel,
                            collective_timeout=args.collective_timeout,
                            flight_recorder_dir=args.flight_recorder_dir)
    except ValueError as e:
        refuse(f"cannot lay out the job: {e}")
    except parallel.MPIEnvironmentError as e:  # a launcher of another MPI than mpi4py's
        refuse(str(e))
    except (RuntimeError, it.NativeError) as e:  # no GPU, no driver, no NCCL: what is missing
        refuse(f"--device {args.device}: {e}")
    take_deepspeed_config(args, args.argv, env.layout.dp, env.device.type, DEEPSPEED_FLAGS, env.is_main)
    if getattr(args, "ds_scheduler", None) is not None:
        typed = typed_flags(args.argv) & {"warmup_iters", "lr_decay", "min_lr"}
        if typed:
            refuse(f"--{', --'.join(sorted(typed))} and --deepspeed_config's scheduler both set the learning-rate "
                   "schedule: give one of them")
    plan = make_plan(args, env)
    if args.save_pretrained and plan.pipelined:
        refuse("--save_pretrained writes a whole model, which no pipeline stage holds: save a checkpoint (--save) "
               "and export it from one process (--load it with --save_pretrained --eval_only)")
    known = _config_of(args) if args.save_pretrained else None
    if known is not None and getattr(known[0], "num_experts", 0):  # before training, not after it
        from infinitrain.hf_llama import check_exportable
        try:
            check_exportable(known[0])
        except ValueError as e:
            refuse(f"--save_pretrained: {str(e).removeprefix('save_pretrained: ')}")
    if plan.zero_has_no_effect and env.is_main:
        print(f"note: --zero_stage {args.zero_stage} has no effect with one data-parallel rank (there is nothing "
              "to shard the optimizer state over); it trains as without ZeRO", flush=True)
    if env.is_main:
        for flag, why in idle_flags(args, plan, env.world_size):
            print(f"note: --{flag} has no effect {why}", flush=True)
    return env, plan


def auto_layout(args) -> None:
    """--layout auto: the plan (infinitrain.plan.auto) sets the layout flags for the job's ranks."""
    from mpi4py import MPI
    from infinitrain.plan.auto import choose
    known = _config_of(args)
    if known is None:
        refuse("--layout auto plans a preset's model (--model); with --llmc_filepath or --from_pretrained give the "
               "layout (python -m infinitrain.plan --config suggests one)")
    try:
        line = choose(args, typed_flags(args.argv), *known, MPI.COMM_WORLD)
    except ValueError as e:
        refuse(str(e))
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(line, flush=True)


def idle_flags(args, plan, world_size: int) -> list:
    """(flag, why) for each flag typed on the command line that does nothing in this run, so
    that it is said once instead of silently ignored."""
    given = typed_flags(getattr(args, "argv", None) or [])
    lora = args.lora_rank or args.lora_load_path
    idle = {"sequence_parallel": (plan.tp == 1, "without --tensor_parallel > 1"),
            "save_interval": (not args.save, "without --save"),
            "max_checkpoint_keep": (not args.save, "without --save"),
            "async_save": (not args.save, "without --save"),
            "lora_alpha": (not lora, "without --lora_rank or --lora_load_path"),
            "lora_target_modules": (not lora, "without --lora_rank or --lora_load_path"),
            "lora_save_path": (not lora, "without --lora_rank or --lora_load_path"),
            "cp_comm": (plan.cp == 1, "without --context_parallel > 1"),
            "pipeline_schedule": (not plan.pipelined, "without --pipeline_parallel > 1"),
            "pipeline_split": (not plan.pipelined, "without --pipeline_parallel > 1"),
            "pipeline_timeout": (not plan.pipelined, "without --pipeline_parallel > 1"),
            "min_lr": (args.lr_decay == "constant", "with --lr_decay constant (the default): add --lr_decay cosine "
                                                    "or linear"),
            "sample_length": (not args.sample_every, "without --sample_every"),
            "val_max_steps": (not args.val_loss_every and not args.eval_only, "without --val_loss_every"),
            "profile_steps": (not args.profile, "without --profile"),
            "collective_timeout": (world_size == 1, "on one process (no collective to wait for)"),
            "flight_recorder_dir": (world_size == 1, "on one process (no collective to record)"),
            "plan_profile": (args.layout != "auto", "without --layout auto"),
            "grad_reduce_dtype": (plan.data_parallel_wrapper != "ddp", "without DDP (more than one data-parallel "
                                                                       "rank, no ZeRO, no pipeline)")}
    return [(flag, why) for flag, (unused, why) in idle.items() if flag in given and unused]


# what a --deepspeed_config sets here (ds_flags.take_deepspeed_config); the schedule stays the flags'
DEEPSPEED_FLAGS = {**COMMON, "train_micro_batch_size_per_gpu": ("batch_size", same),
                   "train_batch_size": ("total_batch_size", lambda v, args: v * args.sequence_length),  # tokens
                   "gradient_accumulation_steps": (None, lambda v, args: None),  # total / (micro x DP)
                   "activation_checkpointing": ("recompute", lambda v, args: "full" if v else "none"),
                   "scheduler": (None, setter("ds_scheduler"))}  # in place of --warmup_iters/--lr_decay/--min_lr


def make_plan(args, env):
    """The ParallelPlan of the flags (flags.plan_of: refused, once, where they cannot work together)."""
    return plan_of(env, sequence_parallel=args.sequence_parallel,
                   virtual_pipeline_parallel=args.virtual_pipeline_parallel,
                   pipeline_schedule=args.pipeline_schedule, pipeline_split=args.pipeline_split,
                   cp_comm=args.cp_comm, cp_a2a_size=args.cp_a2a_size, zero_stage=args.zero_stage,
                   offload_optimizer=args.offload_optimizer,
                   offload_param=args.offload_param, offload_path=args.offload_path, recompute=args.recompute,
                   async_tensor_parallel=not args.no_async_tensor_model_parallel_allreduce)


def resume_from_save(args, log) -> None:
    """--resume auto (the default under mpi_launch --max_restarts): resume from --save's newest
    checkpoint when there is one, in place of --load (as TorchTitan's initial load path: a job
    started from --load and restarted continues its own run, not the --load one again). A
    resumed job keeps the checkpoint's global batch unless --total_batch_size says otherwise, so
    that a job restarted at another size (more accumulation steps when DP shrinks) continues the
    same run."""
    resume = args.resume or ("auto" if os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") not in ("", "0") else "never")
    args.auto_resumed = False
    own = newest_checkpoint(args.save) if resume == "auto" and args.save and not args.eval_only else None
    if own is not None:
        if args.load:
            log(f"--resume auto: {args.save} holds this run's checkpoints; resuming from them, not --load "
                f"{args.load}", flush=True)
        args.load, args.auto_resumed = str(own), True
    if args.load:
        try:
            from infinitrain.checkpoint import read_meta
            meta = read_meta(args.load)
        except CheckpointError as e:
            sys.exit(f"cannot resume: {e}")
        recorded = meta.get("extra", {}).get("model")
        if recorded and not (args.model_given or args.llmc_filepath or args.from_pretrained):
            args.model_recorded = recorded  # the model the checkpoint holds, rebuilt from its config
        saved = meta.get("extra", {}).get("total_batch_size")
        if not args.total_batch_size and saved and not args.eval_only:  # (evaluation takes no step)
            if type(saved) is not int or saved < 1:
                refuse(f"{args.load} records a total_batch_size of {saved!r}, not a positive integer: "
                       "pass --total_batch_size to choose the global batch")
            args.total_batch_size = saved
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
    # the step's micro-batches are read before its first forward (a pipeline schedules them all):
    # token ids and targets, int64, of this rank's share of the global batch
    try:
        check_fits_in_memory(16 * total / dp, f"--total_batch_size {total} (this rank's share of one step's "
                             "tokens and targets, read before the step)", "Use a smaller global batch.")
    except MemoryError as e:
        refuse(str(e))
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
    def read_shards(pattern):  # a path or a glob (prepare text writes train_000000.bin, ...)
        return [read_shard(f) for f in shard_files(pattern)]
    check_input_files(env, [("--input_bin", args.input_bin, read_shards),
                            ("--input_val_bin", args.input_val_bin, read_shards),
                            ("--tokenizer_bin", args.tokenizer_bin, Tokenizer),
                            ("--llmc_filepath", args.llmc_filepath, lambda p: input_file(p, "checkpoint")),
                            ("--from_pretrained", args.from_pretrained,
                             lambda p: input_file(Path(p) / "config.json", "transformers config"))])


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
    from infinitrain.plan.auto import fitting_layouts
    names = fitting_layouts(plan, *known, args.batch_size, args.sequence_length, accum, args.dtype, local_size, have)
    if names:
        ways += f"the plan's best layouts of these ranks that fit ({' | '.join(names)}; --layout auto picks one), "
    sys.exit(f"this job will not fit in memory: {text}. Use {ways}a smaller --model, fewer ranks "
             "per node, --tensor_parallel / --pipeline_parallel to split the model over ranks, "
             "or a smaller --batch_size / --sequence_length")


def build(args, env, plan, build_model, log):
    """The model of this rank's layout, with recomputation and LoRA as asked, on its device."""
    it.manual_seed(args.seed)
    try:
        model = build_model(args, plan.tensor_parallel(), plan.pipeline_stage(), plan.context_parallel(),
                            plan.expert_parallel())
    except (DataFormatError, OSError) as e:  # the checkpoint's contents (its header passed check_inputs)
        sys.exit(f"{'--from_pretrained' if args.from_pretrained else '--llmc_filepath'}: {e}")
    except ValueError as e:  # a layout that does not divide the model
        refuse(f"cannot build the model in this layout ({plan.describe()}): {e}")
    if plan.ep > 1 and not any(p.expert_parallel for p in model.parameters()):
        refuse(f"--expert_parallel {plan.ep} splits a mixture of experts' experts over ranks, but this model has "
               "no experts built over it: use a mixture-of-experts model, or leave --expert_parallel at 1")
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
    recorded = getattr(args, "model_recorded", None) and f"as {args.load} records it"
    source = args.llmc_filepath or args.from_pretrained or recorded or args.model
    log(f"model: {type(model).__name__} {source} | {cfg.n_layer} layers, "
        f"{cfg.n_head} heads, {cfg.n_embd} wide, vocab {cfg.vocab_size} (padded {padded}) | "
        f"{model.num_parameters():,} parameters{' on this rank' if split else ''} | {plan.describe()}", flush=True)
    if getattr(cfg, "num_experts", 0):
        log(f"experts: {cfg.num_experts} of width {cfg.expert_ffn_hidden} (top {cfg.moe_top_k}, {cfg.moe_router}"
            f"{f', {cfg.moe_shared_experts} shared' if cfg.moe_shared_experts else ''}) in every "
            f"{'' if cfg.moe_layer_freq == 1 else f'{cfg.moe_layer_freq}th '}layer | "
            f"{'dropless' if cfg.moe_capacity_factor is None else f'capacity factor {cfg.moe_capacity_factor:g}'} | "
            f"aux loss {cfg.moe_aux_loss_coeff:g}, z-loss {cfg.moe_z_loss_coeff:g}, "
            f"bias update rate {cfg.moe_bias_update_rate:g}", flush=True)
    log(f"batch: {args.batch_size} x {args.sequence_length} tokens x {accum} "
        f"{'micro-batches' if plan.pipelined else 'accumulation steps'} x {plan.dp} data-parallel ranks = "
        f"{args.total_batch_size} tokens per step | {it.get_num_threads()} threads per rank", flush=True)
    if plan.pipelined:
        log(f"pipeline: {plan.pipeline_schedule} schedule over {plan.pp} stages x "
            f"{plan.virtual_pipeline_parallel} chunks, layers per chunk {[len(c) for c in model.stage_layers]} "
            f"on stage 0", flush=True)


def setup_lora(model, args, log) -> None:
    """Adapters as the flags say (or as the saved ones are), loaded if asked."""
    rank, alpha = args.lora_rank, args.lora_alpha
    targets = [t for t in args.lora_target_modules.split(",") if t]
    try:
        saved = read_lora_config(args.lora_load_path) if args.lora_load_path else None
        if saved is not None:
            rank = rank or saved["r"]
            alpha = alpha if alpha is not None else saved["lora_alpha"]
        # PEFT's adapters say which layers they adapt (load_lora applies them so, with their alpha
        # unless --lora_alpha is given); a rank or targets given, or the earlier format, say it here
        given = args.lora_rank or args.lora_target_modules != ",".join(DEFAULT_TARGETS)
        if saved is None or given or "peft_type" not in saved:
            names = apply_lora(model, rank, alpha, targets, seed=args.seed)
        if saved is not None:
            names = load_lora(model, args.lora_load_path, alpha=alpha)
    except (ValueError, CheckpointError) as e:
        sys.exit(f"cannot set up LoRA: {e}")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log(f"LoRA: rank {rank}, alpha {model.lora_config['lora_alpha']:g} on {len(names)} layers "
        f"({', '.join(sorted({n.split('.', 3)[-1] for n in names}))}) | {trainable:,} trainable of "
        f"{model.num_parameters():,} parameters{' on this rank' if model.tp or model.pp else ''}"
        + (f" | adapters from {args.lora_load_path}" if args.lora_load_path else ""), flush=True)


def _config_of(args):
    """The model's configuration before it is built: the preset's, or the one --load's
    checkpoint records (None for an llm.c file or a transformers folder: known once read)."""
    from infinitrain.models import GPT2, LLaMA3, GPT2Config
    if args.llmc_filepath or args.from_pretrained:
        return None
    cls = GPT2 if isinstance(args.presets[args.model], GPT2Config) else LLaMA3
    recorded = recorded_config(args, cls)
    return (recorded if recorded is not None else args.presets[args.model]), cls


def recorded_config(args, cls):
    """The configuration --load's checkpoint records for its model (cls.config_class), when no
    --model, --llmc_filepath or --from_pretrained says otherwise; None without one."""
    recorded = getattr(args, "model_recorded", None)
    if recorded is None:
        return None
    if recorded.get("class") != cls.__name__:
        refuse(f"--load {args.load} holds a {recorded.get('class')}, not a {cls.__name__}: use the example "
               "of that model")
    try:
        return cls.config_class(**recorded["config"])
    except (KeyError, TypeError, ValueError) as e:
        refuse(f"--load {args.load}: its recorded model configuration cannot be read ({e}); give --model")


