"""Trains GPT-2 on llm.c token shards, with InfiniTrain's flags and log line.

    python -m infinitrain.examples.gpt2 --model small --num_iteration 50 --sample_every 50

With no data flags it trains on Shakespeare (prepared on first use, offline). Prints one line
per step:

    step    1/10 | train loss 10.996094 | lr 1.00e-04 | (123.45 ms | 1234 tok/s | peak used:   512 MB | DP=1, TP=1, SP=0, PP=1)
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import infinitrain as it
from infinitrain.data import Tokenizer, TokenLoader
from infinitrain.data.prepare import shakespeare_files
from infinitrain.models import GPT2, GPT2_PRESETS, gpt2
from infinitrain.nn.utils import clip_grad_norm_
from infinitrain.optim import AdamW
from infinitrain.optim.lr_scheduler import ConstantLR, WarmupConstantLR


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input_bin", default=None, help="training token shard(s), a path or glob (default: Shakespeare)")
    p.add_argument("--input_val_bin", default=None, help="validation token shard(s)")
    p.add_argument("--tokenizer_bin", default=None, help="llm.c tokenizer file, to print samples")
    p.add_argument("--llmc_filepath", default=None, help="start from this llm.c GPT-2 checkpoint (overrides --model)")
    p.add_argument("--model", default="gpt2", choices=sorted(GPT2_PRESETS), help="preset (default gpt2 = d12, 124M)")
    p.add_argument("--batch_size", type=int, default=4, help="sequences per micro-batch")
    p.add_argument("--sequence_length", type=int, default=64)
    p.add_argument("--total_batch_size", type=int, default=None,
                   help="tokens per optimizer step; gradient accumulation makes up the difference "
                        "(default: batch_size * sequence_length)")
    p.add_argument("--num_iteration", type=int, default=10)
    p.add_argument("--learning_rate", type=float, default=1e-4)
    p.add_argument("--weight_decay", type=float, default=0.0, help="AdamW decay, on 2-D weights only")
    p.add_argument("--grad_clip", type=float, default=0.0, help="max gradient norm (0 = no clipping)")
    p.add_argument("--warmup_iters", type=int, default=0, help="linear warmup steps, then constant")
    p.add_argument("--dtype", default="float32", choices=["float32"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--val_loss_every", type=int, default=0, help="0 = never")
    p.add_argument("--val_max_steps", type=int, default=20)
    p.add_argument("--sample_every", type=int, default=0, help="0 = never")
    p.add_argument("--sample_length", type=int, default=64)
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device != "cpu":
        it.zeros(1, device=args.device)  # raises the library's clear error until CUDA lands
    B, T = args.batch_size, args.sequence_length
    tokens_per_micro = B * T
    total = args.total_batch_size or tokens_per_micro
    if total % tokens_per_micro:
        sys.exit(f"--total_batch_size {total} is not a multiple of batch_size * sequence_length "
                 f"= {tokens_per_micro}")
    accum = total // tokens_per_micro

    if args.input_bin is None:
        files = shakespeare_files()
        args.input_bin = str(files["train"])
        args.input_val_bin = args.input_val_bin or str(files["val"])
        args.tokenizer_bin = args.tokenizer_bin or str(files["tokenizer"])

    it.manual_seed(args.seed)
    if args.llmc_filepath:
        model = GPT2.from_llmc(args.llmc_filepath)
    else:
        model = gpt2(args.model)
    cfg = model.config
    if T > cfg.block_size:
        sys.exit(f"--sequence_length {T} exceeds the model's block size {cfg.block_size}")
    print(f"model: {args.llmc_filepath or args.model} | {cfg.n_layer} layers, {cfg.n_head} heads, "
          f"{cfg.n_embd} wide, vocab {cfg.vocab_size} (padded {cfg.padded_vocab_size}) | "
          f"{model.num_parameters():,} parameters", flush=True)
    print(f"batch: {B} x {T} tokens x {accum} accumulation steps = {total} tokens per step | "
          f"{it.get_num_threads()} threads", flush=True)

    train = TokenLoader(args.input_bin, B, T, vocab_size=cfg.vocab_size)
    val = TokenLoader(args.input_val_bin, B, T, vocab_size=cfg.vocab_size) if args.input_val_bin else None
    tokenizer = Tokenizer(args.tokenizer_bin) if args.tokenizer_bin else None

    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = AdamW([{"params": decay, "weight_decay": args.weight_decay},
                       {"params": no_decay, "weight_decay": 0.0}],
                      lr=args.learning_rate, betas=(0.9, 0.95), eps=1e-8)
    schedule = WarmupConstantLR(optimizer, args.warmup_iters, args.num_iteration) \
        if args.warmup_iters else ConstantLR(optimizer)

    for step in range(1, args.num_iteration + 1):
        if val is not None and args.val_loss_every and (step == 1 or step % args.val_loss_every == 0):
            print(f"val loss {evaluate(model, val, args.val_max_steps):.6f}", flush=True)
        if tokenizer is not None and args.sample_every and step % args.sample_every == 0:
            sample(model, tokenizer, args)

        it.reset_peak_memory_stats()
        t0 = time.perf_counter()
        lr = optimizer.param_groups[0]["lr"]
        loss_sum = 0.0
        for _ in range(accum):
            x, y = train.next_batch()
            _, loss = model(x, y, return_logits=False)
            (loss / accum if accum > 1 else loss).backward()
            loss_sum += loss.item()
        if args.grad_clip > 0:
            clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        ms = (time.perf_counter() - t0) * 1e3
        peak_mb = it.memory_stats()["peak_allocated_bytes"] // 2**20
        print(f"step {step:4d}/{args.num_iteration} | train loss {loss_sum / accum:.6f} | lr {lr:.2e} | "
              f"({ms:.2f} ms | {total / ms * 1e3:.0f} tok/s | peak used: {peak_mb:5d} MB | "
              f"DP=1, TP=1, SP=0, PP=1)", flush=True)

    if val is not None and args.val_loss_every:
        print(f"val loss {evaluate(model, val, args.val_max_steps):.6f}", flush=True)
    if tokenizer is not None and args.sample_every:
        sample(model, tokenizer, args)
    return 0


@it.no_grad()
def evaluate(model, loader, max_steps: int) -> float:
    model.eval()
    loader.reset()
    steps = max(1, min(max_steps, len(loader.shards[0]) // (loader.B * loader.T)))
    total = 0.0
    for _ in range(steps):
        x, y = loader.next_batch()
        total += model(x, y, return_logits=False)[1].item()
    model.train()
    return total / steps


def sample(model, tokenizer, args) -> None:
    model.eval()
    start = it.tensor([[tokenizer.eot_token]])
    out = model.generate(start, args.sample_length, temperature=1.0, top_k=40, seed=args.seed)
    text = tokenizer.decode(out.numpy()[0, 1:])
    model.train()
    print("---- sample ----\n" + text + "\n----------------", flush=True)


if __name__ == "__main__":
    sys.exit(main())
