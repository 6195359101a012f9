"""Trains a tiny GPT-2 or LLaMA-3 for a few AdamW steps under DP x TP (± SP) x PP x CP, with ZeRO,
LoRA or recomputation, through the trainer's own step (nn.parallel.train_step) on a fixed
global batch and prints one line per step ("loss <step> <value>") from rank 0; on one process
with the defaults it is the reference. The global batch (--batch sequences) is split over DP
and then into --micro micro-batches, so every layout trains on the same tokens. At the end
every parameter replicated across the TP group must be bit-identical on its ranks, and the
pipeline's two copies of a tied embedding equal. `A --then B ...` runs A, then B, ... in the
one job (each its own layout over every rank, rank 0's lines of each after "run <i>"): what
the tests batch to start fewer jobs.

    mpiexec -n 8 python parallel_train.py --model gpt2 --tp 2 --sp --pp 2 --vpp 2 --micro 4
"""
import argparse
import gc
import hashlib
import sys

import numpy as np

import infinitrain as it
from infinitrain.amp import autocast
from infinitrain.checkpoint import load_checkpoint, load_lora, save_checkpoint, save_lora
from infinitrain.models import GPT2Config, LLaMA3Config
from infinitrain.models.gpt2 import GPT2
from infinitrain.models.llama3 import LLaMA3
from infinitrain.nn import parallel
from infinitrain.nn.lora import apply_lora
from infinitrain.nn.parallel.train_step import TrainStep, decay_groups
from infinitrain.optim import AdamW, offload

DEFAULT_BUFFER_MB = offload.BUFFER_MB

p = argparse.ArgumentParser()
p.add_argument("--model", choices=["gpt2", "llama3"], default="gpt2")
p.add_argument("--tp", type=int, default=1)
p.add_argument("--sp", action="store_true")
p.add_argument("--pp", type=int, default=1)
p.add_argument("--cp", type=int, default=1)
p.add_argument("--cp_comm", default="p2p")
p.add_argument("--cp_a2a_size", type=int, default=None)
p.add_argument("--ep", type=int, default=1, help="expert parallelism (llama3 with --experts)")
p.add_argument("--experts", type=int, default=0, help="llama3: MoE layers of this many experts (0: dense)")
p.add_argument("--moe_top_k", type=int, default=2)
p.add_argument("--moe_aux", type=float, default=0.0, help="the load-balancing loss's coefficient")
p.add_argument("--moe_capacity", type=float, default=None, help="the capacity factor (None: dropless)")
p.add_argument("--moe_router", default="softmax", help="softmax | sigmoid")
p.add_argument("--moe_bias_rate", type=float, default=0.0,
               help="DeepSeek-V3's selection biases, updated after every step from the step's loads")
p.add_argument("--one_expert", action="store_true",
               help="the routers start at zero: with --moe_top_k 1 every token goes to expert 0 at every step")
p.add_argument("--vpp", type=int, default=1)
p.add_argument("--schedule", default=None, help="gpipe | 1f1b | interleaved (default by --vpp)")
p.add_argument("--keep_sent", action="store_true", help="a stage keeps its sent outputs' memory until backward")
p.add_argument("--micro", type=int, default=1, help="micro-batches per step (per DP rank)")
p.add_argument("--layers", type=int, default=2)
p.add_argument("--vocab", type=int, default=50257)
p.add_argument("--embd", type=int, default=32)
p.add_argument("--dtype", default="float32")
p.add_argument("--steps", type=int, default=10)
p.add_argument("--first", type=int, default=1, help="step to start at (after --load)")
p.add_argument("--batch", type=int, default=4, help="global batch (sequences)")
p.add_argument("--seq", type=int, default=16)
p.add_argument("--lr", type=float, default=1e-2)
p.add_argument("--clip", type=float, default=1.0)
p.add_argument("--save", default=None)
p.add_argument("--load", default=None)
p.add_argument("--zero", type=int, default=0, help="ZeRO stage over DP (replaces DDP)")
p.add_argument("--offload", default=None, help="cpu | nvme: the optimizer state offloaded (OffloadOptimizer)")
p.add_argument("--offload_path", default=None)
p.add_argument("--offload_param", default=None, help="cpu | nvme: ZeRO-3's parameter pieces offloaded with the state")
p.add_argument("--offload_buffer_mb", type=float, default=None, help="the offload's block size (small: many blocks)")
p.add_argument("--recompute", default="none", help="activation recomputation: none | full | selective")
p.add_argument("--lora", type=int, default=0, help="LoRA rank on the default targets (0 = off)")
p.add_argument("--lora_save", default=None, help="save the adapters alone to this folder at the end")
p.add_argument("--lora_load", default=None, help="load adapters saved so before training")
p.add_argument("--pipeline_timeout", type=float, default=120.0)
p.add_argument("--hang_stage", type=int, default=None, help="this stage stops answering (a test of timeouts)")
p.add_argument("--llmc", default=None, help="start from this llm.c checkpoint (each rank its slice)")
p.add_argument("--hf", default=None, help="start from this transformers folder (save_pretrained; each rank its slice)")


def moe_options(args) -> dict:
    """A tiny mixture of experts: experts of width 32 (every layer's MLP)."""
    if not args.experts:
        return {}
    return dict(num_experts=args.experts, moe_top_k=args.moe_top_k, moe_ffn_hidden=32,
                moe_aux_loss_coeff=args.moe_aux, moe_capacity_factor=args.moe_capacity, moe_router=args.moe_router,
                moe_bias_update_rate=args.moe_bias_rate)


def digest(q) -> int:
    return int(np.frombuffer(hashlib.sha256(q.detach().float().numpy().tobytes()).digest()[:8], np.int64)[0])


def same_everywhere(value: int, group) -> bool:
    hi, lo = it.tensor([value], dtype=it.int64), it.tensor([value], dtype=it.int64)
    group.all_reduce(hi, parallel.ReduceOp.MAX)
    group.all_reduce(lo, parallel.ReduceOp.MIN)
    return hi.item() == lo.item()



def train(args, run=None):
    """One run: its layout over every rank of the job (parallel.init again for each run of a
    job of several); rank 0 prints its lines, after "run <run>" when one job holds several.
    Returns the job's GlobalEnv."""
    offload.BUFFER_MB = DEFAULT_BUFFER_MB if args.offload_buffer_mb is None else args.offload_buffer_mb
    env = parallel.init(tensor_parallel=args.tp, pipeline_parallel=args.pp, context_parallel=args.cp,
                        expert_parallel=args.ep)
    if run is not None and env.rank == 0:
        print(f"run {run}", flush=True)
    plan = parallel.ParallelPlan(env, sequence_parallel=args.sp, virtual_pipeline_parallel=args.vpp,
                                 pipeline_schedule=args.schedule, cp_comm=args.cp_comm, cp_a2a_size=args.cp_a2a_size,
                                 zero_stage=args.zero,
                                 offload_optimizer=args.offload, offload_path=args.offload_path,
                                 offload_param=args.offload_param, recompute=args.recompute)
    tp, stage, cp = plan.tensor_parallel(), plan.pipeline_stage(), plan.context_parallel()
    dp, dp_rank = plan.dp, plan.coords.dp
    if args.model == "gpt2":
        cfg = GPT2Config(block_size=64, vocab_size=args.vocab, n_layer=args.layers, n_head=4, n_embd=args.embd)
        model = GPT2.from_llmc(args.llmc, tp=tp, pp=stage, cp=cp) if args.llmc else \
            GPT2.from_pretrained(args.hf, tp=tp, pp=stage, cp=cp) if args.hf else \
            GPT2(cfg, seed=5, tp=tp, pp=stage, cp=cp)
    else:  # grouped-query attention: 8 query heads, 4 KV heads
        cfg = LLaMA3Config(block_size=64, vocab_size=args.vocab, n_layer=args.layers, n_head=8, n_kv_head=4,
                           n_embd=args.embd, ffn_dim_multiplier=None, multiple_of=32, rope_theta=10000.0,
                           **moe_options(args))
        model = LLaMA3.from_llmc(args.llmc, tp=tp, pp=stage, cp=cp) if args.llmc else \
            LLaMA3.from_pretrained(args.hf, tp=tp, pp=stage, cp=cp) if args.hf else \
            LLaMA3(cfg, seed=5, tp=tp, pp=stage, cp=cp, ep=plan.expert_parallel())
        for name, q in model.named_parameters():
            if args.one_expert and name.endswith(".mlp.gate.weight"):
                with it.no_grad():
                    q.zero_()
    model.set_recompute(plan.recompute)
    if args.lora:
        apply_lora(model, args.lora, alpha=2 * args.lora, seed=7)
        if args.lora_load:
            load_lora(model, args.lora_load)
    trainer = TrainStep(model, plan, decay_groups(model, 0.1), AdamW, pipeline_timeout=args.pipeline_timeout,
                        bucket_cap_mb=0.25,
                        set_to_none=False,  # gradients stay allocated: a step's peak above its start is activations
                        lr=args.lr, betas=(0.9, 0.95))
    opt, pipe = trainer.optimizer, trainer.pipe
    if pipe is not None and args.keep_sent:
        pipe.deallocate_outputs = False
    if args.load:
        load_checkpoint(args.load, model, opt)


    def context():
        return autocast("cpu", dtype=args.dtype, enabled=args.dtype != "float32")


    B, T, M = args.batch // dp, args.seq, args.micro
    b = B // M
    assert b >= 1, f"--batch {args.batch} cannot give {dp} DP ranks {M} micro-batches each"
    activation_peak = 0  # the most memory a step held above what it started with (rank 0: stage 0)
    for step in range(args.first, args.steps + 1):
        start = it.memory_stats()["allocated_bytes"]
        if step > args.first:  # the peak over the steps after the first (all state allocated)
            it.reset_peak_memory_stats()
        # two batches in turn from a few hundred ids: the loss falls fast, so steps differ a lot
        data = np.random.default_rng(step % 2).integers(0, min(300, args.vocab), (args.batch, T + 1))
        mine = data[dp_rank * B:(dp_rank + 1) * B]
        micro = [(it.from_numpy(mine[m * b:(m + 1) * b, :-1].copy()), it.from_numpy(mine[m * b:(m + 1) * b, 1:].copy()))
                 for m in range(M)]
        if args.hang_stage is not None and env.coords.pp == args.hang_stage:
            import time
            time.sleep(3600)
        value = trainer.forward_backward(micro, forward_context=context)
        if step > args.first:  # the first step also allocates the gradients
            activation_peak = max(activation_peak, it.memory_stats()["peak_allocated_bytes"] - start)
        norm = trainer.optimizer_step(args.clip)
        if args.moe_bias_rate:  # the loads summed over DP x CP, as the examples' loop does
            from infinitrain.examples.moe_flags import moe_reducer
            model.update_moe_biases(moe_reducer(plan, "cpu"))
        if env.rank == 0:
            print(f"loss {step} {np.float32(value):.9g} norm {norm:.9g}", flush=True)
    if args.moe_bias_rate and env.rank == 0:  # (rank 0 holds the first layer in every layout)
        bias = model.transformer.h[0].mlp.gate.e_score_correction_bias
        print(f"biases {' '.join(f'{v:.9g}' for v in bias.float().cpu().numpy())}", flush=True)
    train_peak = it.memory_stats()["peak_allocated_bytes"]  # before the checks below gather anything


    with trainer.gathered_parameters():  # ZeRO-3 holds them sharded
        # replicated parameters (not TP shards) must be bit-identical across the TP group
        for name, q in model.named_parameters():
            if q.tp_shard is None:
                assert same_everywhere(digest(q), env.tp_group), \
                    f"{name} differs across the TP group after {args.steps} steps"
        # the tied embedding's two copies (first and last stage) must be equal
        for q in model.tied_parameters():
            assert same_everywhere(digest(q), env.embedding_group), "the tied embedding's copies differ"
    # sampling runs the model on sequences of every length (padded to a multiple of TP under SP)
    with it.no_grad():
        tokens = model.generate(it.tensor([[1, 2, 3]]), 5, top_k=20, seed=1,
                                forward=pipe.logits if pipe else None).numpy()[0].tolist()
    whole = hashlib.sha256()  # this rank's parameters bit for bit: what a refactoring must not move
    with trainer.gathered_parameters():
        for q in model.parameters():
            whole.update(q.detach().float().numpy().tobytes())
    if env.rank == 0:
        print(f"digest {whole.hexdigest()} norm {norm!r}", flush=True)
        print(f"sample {tokens}", flush=True)
        print(f"activation_peak {activation_peak}", flush=True)
        print(f"peak_bytes {train_peak}", flush=True)
        print(f"parameters {sum(q.numel() for q in model.parameters())}", flush=True)
    if args.save:  # one writer per stage: the pipeline of DP rank 0, TP rank 0
        save_checkpoint(args.save, args.steps, model, opt, write=plan.writes_files)
        env.world.barrier()
    if args.lora_save:
        save_lora(model, args.lora_save, write=plan.writes_files, optimizer=opt)
        env.world.barrier()
    return env


runs = [[]]
for word in sys.argv[1:]:
    if word == "--then":
        runs.append([])
    else:
        runs[-1].append(word)
for i, run_words in enumerate(runs):
    gc.collect()  # what the run before left is freed before this one measures its memory
    env = train(p.parse_args(run_words), i if len(runs) > 1 else None)
env.world.barrier()  # rank 0's lines are out before any rank's OK (lines of ranks interleave)
print(f"rank {env.rank} OK", flush=True)
