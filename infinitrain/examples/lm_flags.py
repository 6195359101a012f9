"""The flags of the language-model examples (GPT-2, LLaMA-3): InfiniTrain's names where it has
them, llm.c's defaults, every value checked when read (examples/flags.py)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from infinitrain.examples.flags import (add_async_tp_flag, add_monitor_flags, add_nan_check_flag, nonnegative_float,
                                       nonnegative_int, positive_float, positive_int)
from infinitrain.examples.ds_flags import add_config_arguments
from infinitrain.examples.moe_flags import add_moe_flags, apply_moe_flags
from infinitrain.nn.lora import DEFAULT_TARGETS
from infinitrain.nn.parallel.pp import SCHEDULES


def parse_args(argv, description: str, presets, default_model: str, moe: bool = False, rope: bool = False):
    """moe: the model can have experts (LLaMA-3): the MoE flags (moe_flags.py) are taken. rope:
    its positions are rotary (LLaMA-3), so --max_position_embeddings may lift the preset's
    block size (a learned position table, GPT-2's, has as many rows as it has)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)  # a flag is its full name: the typed ones are checked
    p.add_argument("--input_bin", default=None, help="training token shard(s), a path or glob (default: Shakespeare)")
    p.add_argument("--input_val_bin", default=None, help="validation token shard(s)")
    p.add_argument("--tokenizer_bin", default=None, help="llm.c tokenizer file, to print samples")
    p.add_argument("--llmc_filepath", default=None, help="start from this llm.c checkpoint (overrides --model)")
    p.add_argument("--from_pretrained", default=None, metavar="DIR",
                   help="start from a Hugging Face transformers folder (config.json and model.safetensors, as "
                        "save_pretrained writes; overrides --model), each rank reading its slice")
    p.add_argument("--save_pretrained", default=None, metavar="DIR",
                   help="at the end, write the trained model as a transformers folder (GPT2LMHeadModel or "
                        "LlamaForCausalLM) that AutoModelForCausalLM.from_pretrained loads")
    p.add_argument("--model", default=None, choices=sorted(presets),
                   help=f"preset (default {default_model}, or with --load the model its checkpoint records)")
    p.add_argument("--batch_size", type=positive_int, default=4, help="sequences per micro-batch")
    p.add_argument("--sequence_length", type=positive_int, default=64)
    p.add_argument("--total_batch_size", type=positive_int, default=None,
                   help="tokens per optimizer step; gradient accumulation makes up the difference "
                        "(default: batch_size * sequence_length)")
    p.add_argument("--num_iteration", type=positive_int, default=10)
    p.add_argument("--learning_rate", type=nonnegative_float, default=1e-4)
    p.add_argument("--weight_decay", type=nonnegative_float, default=0.0, help="AdamW decay, on 2-D weights only")
    p.add_argument("--grad_clip", type=nonnegative_float, default=0.0, help="max gradient norm (0 = no clipping)")
    p.add_argument("--warmup_iters", type=nonnegative_int, default=0,
                   help="linear warmup steps, then --lr_decay")
    p.add_argument("--lr_decay", default="constant", choices=["constant", "cosine", "linear"],
                   help="after the warmup: keep --learning_rate, or decay it to --min_lr at --num_iteration "
                        "(cosine: llm.c's and Megatron's)")
    p.add_argument("--min_lr", type=nonnegative_float, default=0.0,
                   help="the learning rate --lr_decay cosine or linear ends at (Megatron's --min-lr)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="bfloat16: autocast (bf16 matrix products, fp32 master weights and optimizer)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--val_loss_every", type=nonnegative_int, default=0, help="0 = never")
    p.add_argument("--val_max_steps", type=positive_int, default=20)
    p.add_argument("--eval_only", action="store_true",
                   help="only the validation loss of the model (--load's checkpoint, --llmc_filepath's weights or "
                        "the preset's initialisation) on --input_val_bin, over --val_max_steps batches; no training")
    p.add_argument("--sample_every", type=nonnegative_int, default=0, help="0 = never")
    p.add_argument("--sample_length", type=positive_int, default=64)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--save", default=None, help="folder for checkpoints to resume from")
    p.add_argument("--save_interval", type=nonnegative_int, default=0, help="save every N steps (0 = only at the end)")
    p.add_argument("--max_checkpoint_keep", type=nonnegative_int, default=0, help="keep the newest K (0 = all)")
    p.add_argument("--load", default=None, help="resume from this checkpoint (or folder holding 'latest')")
    add_nan_check_flag(p)
    p.add_argument("--collective_timeout", type=nonnegative_float, default=None,
                   help="seconds a collective or receive may take before the watchdog aborts the job, "
                        "naming the stuck rank and writing flight records (default 600; 0 = off)")
    p.add_argument("--flight_recorder_dir", default=None,
                   help="where the watchdog writes each rank's flight record (default ./flight_recorder)")
    p.add_argument("--async_save", action="store_true",
                   help="write checkpoints in the background: the state is copied at the step and a thread "
                        "writes it while training goes on ('latest' moves once it is complete)")
    p.add_argument("--resume", default=None, choices=["auto", "never"],
                   help="auto: resume from --save's latest checkpoint when there is one (the default "
                        "under mpi_launch --max_restarts, so a restarted job goes on where it stopped)")
    p.add_argument("--tensor_parallel", type=positive_int, default=1,
                   help="ranks that split each layer's weights (Megatron-style); DP = world / (TP * CP * PP)")
    p.add_argument("--sequence_parallel", action="store_true",
                   help="with --tensor_parallel > 1: split activations between TP regions along the sequence")
    add_async_tp_flag(p)
    p.add_argument("--context_parallel", type=positive_int, default=1,
                   help="ranks that split every sequence (context parallelism: each holds T/CP tokens, "
                        "attention passes K/V between them)")
    p.add_argument("--expert_parallel", type=positive_int, default=1,
                   help="ranks that split a mixture of experts' experts (each holds num_experts / EP), carved "
                        "out of the DP x CP ranks: tokens travel to their experts with an all-to-all")
    p.add_argument("--cp_comm", default="p2p", choices=["p2p", "all_gather", "a2a", "a2a+p2p"],
                   help="context-parallel attention: p2p passes K/V around a ring overlapped with the "
                        "block products; all_gather gathers them at once (small CP groups); a2a splits the "
                        "heads over CP inside attention with two all-to-alls (DeepSpeed-Ulysses); a2a+p2p "
                        "all-to-all inside groups of --cp_a2a_size ranks, a ring across them")
    p.add_argument("--cp_a2a_size", type=positive_int, default=None,
                   help="--cp_comm a2a+p2p: the CP ranks of each all-to-all group (default: those of one node)")
    p.add_argument("--layout", default=None, choices=["auto"],
                   help="auto: the plan (python -m infinitrain.plan) picks the layout for the job's ranks: TP, SP, "
                        "PP and its schedule, CP, and the ZeRO stage, recomputation and --batch_size unless typed")
    p.add_argument("--plan_profile", default=None, metavar="FILE",
                   help="with --layout auto: this machine's rates (python -m infinitrain.plan calibrate)")
    p.add_argument("--pipeline_parallel", type=positive_int, default=1,
                   help="pipeline stages the model's layers are split over")
    p.add_argument("--virtual_pipeline_parallel", type=positive_int, default=1,
                   help="model chunks per pipeline stage (> 1: interleaved 1F1B by default; 2 with zbv)")
    p.add_argument("--pipeline_schedule", default=None, choices=list(SCHEDULES),
                   help="default: 1f1b, or interleaved with --virtual_pipeline_parallel > 1; zb-h1: 1F1B with "
                        "each backward's weight gradients deferred into the idle slots (zero bubble); zbv: two "
                        "chunks per stage in a V (--virtual_pipeline_parallel 2), the W's filling the rest. "
                        "The micro-batches of a step are its gradient accumulation steps")
    p.add_argument("--pipeline_split", default="balanced", choices=["balanced", "even"],
                   help="balanced: the head counts as the blocks' worth of work it is, so the last stage gets "
                        "fewer blocks; even: the same number of blocks on every stage")
    p.add_argument("--pipeline_timeout", type=positive_float, default=300.0,
                   help="seconds a stage waits for a neighbour before aborting the job")
    p.add_argument("--zero_stage", type=int, default=0, choices=[0, 1, 2, 3],
                   help="ZeRO over the data-parallel ranks (replaces DDP): 1 shards the optimizer "
                        "state, 2 also the gradients, 3 also the parameters (gathered per layer)")
    p.add_argument("--grad_reduce_dtype", default=None, choices=["float32", "bfloat16"],
                   help="the dtype DDP averages the gradients in (default: theirs, float32 with the fp32 master "
                        "weights of --dtype bfloat16): float32 sums bf16 gradients without rounding between "
                        "ranks (Megatron's --accumulate-allreduce-grads-in-fp32, FSDP2's reduce_dtype); "
                        "bfloat16 sends half the bytes where the backend sums bf16 (NCCL; MPI sums it in float32)")
    p.add_argument("--offload_optimizer", default="none", choices=["none", "cpu", "nvme"],
                   help="where the AdamW state (each rank's ZeRO shard of it) lives: cpu, in host memory "
                        "(off the GPU, updated there); nvme, in a scratch file under --offload_path, "
                        "streamed through in blocks by a background thread (off a CPU node's memory)")
    p.add_argument("--offload_param", default="none", choices=["none", "cpu", "nvme"],
                   help="with --zero_stage 3: each rank's pieces of the parameters live with the AdamW state "
                        "(the same place as --offload_optimizer), read back one layer ahead of use; also on "
                        "one rank (ZeRO-Infinity)")
    p.add_argument("--offload_path", default=None, metavar="DIR",
                   help="folder on a local disk for --offload_optimizer nvme (needs 8 bytes per parameter, "
                        "12 with --offload_param nvme)")
    p.add_argument("--recompute", default="none", choices=["none", "full", "selective"],
                   help="activation recomputation: full keeps only each block's input and reruns "
                        "the block in backward; selective reruns the MLP's activation and down "
                        "projection (its widest activations)")
    p.add_argument("--lora_rank", type=nonnegative_int, default=0,
                   help="LoRA adapters of this rank on the target layers, base weights frozen (0 = off)")
    p.add_argument("--lora_alpha", type=positive_float, default=None, help="LoRA scale numerator (default: the rank)")
    p.add_argument("--lora_target_modules", default=",".join(DEFAULT_TARGETS),
                   help="comma-separated layer names (or name suffixes) that get adapters")
    p.add_argument("--lora_save_path", default=None,
                   help="save the adapters alone to this folder at the end, in PEFT's format (adapter_config.json + "
                        "adapter_model.safetensors; with --save_pretrained, the base they go with)")
    p.add_argument("--lora_load_path", default=None,
                   help="start from adapters in PEFT's format (their rank, alpha and layers unless given) or "
                        "this package's earlier one")
    p.add_argument("--peak_tflops", type=positive_float, default=None,
                   help="per-rank peak TFLOP/s for the MFU figure (default: measured at start from "
                        "matrix products in --dtype on all ranks at once)")
    add_monitor_flags(p)
    p.add_argument("--plot", default=None, metavar="PNG", help="draw the train/val loss curves to this PNG at the end")
    p.add_argument("--profile", default=None, metavar="PATH",
                   help="profile --profile_steps steps (from the second): print the op table and "
                        "write a Chrome trace of every rank to PATH")
    p.add_argument("--profile_steps", type=positive_int, default=3)
    p.add_argument("--precision_check", default=None, metavar="CONFIG",
                   help="InfiniTrain's precision checker, e.g. 'level=1,format=simple,output_md5=true,"
                        "save_tensors=true,output_path=PATH' (level 2: every op) or with 'baseline=PATH' "
                        "to name the first tensor that differs from a run saved there by more than round-off")
    if moe:
        add_moe_flags(p)
    if rope:
        p.add_argument("--max_position_embeddings", type=positive_int, default=None,
                       help="the longest sequence the preset takes (its block size; Megatron's and Hugging Face's "
                            "name): rotary positions have no table to outgrow, e.g. --model small "
                            "--max_position_embeddings 8192 --sequence_length 8192")
    add_config_arguments(p)
    # AdamW's betas and eps (GPT-3's); a DeepSpeed config may set them, and its schedule
    p.set_defaults(presets=presets, betas=(0.9, 0.95), eps=1e-8, ds_scheduler=None)
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)  # the flags typed (a DeepSpeed config may not repeat them)
    args.model_given = args.model is not None  # (else --load's checkpoint may say which model it holds)
    args.model = args.model or default_model
    if args.from_pretrained and args.llmc_filepath:
        p.error("--from_pretrained and --llmc_filepath both name the weights to start from: give one")
    args.moe_overrides, args.moe_log_every = {}, getattr(args, "moe_log_every", 0)
    if moe:
        apply_moe_flags(args, p.error)
    if getattr(args, "max_position_embeddings", None):
        if args.llmc_filepath or args.from_pretrained:
            p.error("--max_position_embeddings sizes a preset; a checkpoint's model keeps its own block size")
        args.presets = {**args.presets, args.model: replace(args.presets[args.model],
                                                            block_size=args.max_position_embeddings)}
    if args.min_lr > args.learning_rate:
        p.error(f"--min_lr {args.min_lr:g} is above --learning_rate {args.learning_rate:g}: the decay ends below "
                "where it starts")
    return args
