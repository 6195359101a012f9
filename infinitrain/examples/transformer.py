"""Trains the original encoder-decoder Transformer to translate English to German, on the real
parallel text of Django's and Wagtail's German catalogs (prepared offline on first use, see
infinitrain.data.translation), then translates the validation sentences with greedy and beam
search and scores them with BLEU (sacrebleu) against copying the source. A DeepSpeed config
(--deepspeed_config, see infinitrain/deepspeed/configs) sets the batch, accumulation, clipping,
AdamW's settings, the schedule, ZeRO, offload and bf16 in place of their flags:

    python -m infinitrain.examples.transformer --model small
    mpirun -np 2 python -m infinitrain.examples.transformer --zero_stage 1
    mpirun -np 4 python -m infinitrain.examples.transformer --tensor_parallel 2
    mpirun -np 2 python -m infinitrain.examples.transformer --deepspeed --deepspeed_config ds_config.json

    step 1500/1500 | train loss 1.279285 | lr 3.65e-04 | (202.7 ms | 2333 tok/s | DP=1, TP=1)
    BLEU on 124 validation pairs: greedy 50.2, beam 4 47.7, copying the source 41.8

The paper's recipe: AdamW (0.9, 0.98, eps 1e-9), the inverse-square-root schedule with linear
warm-up (--learning_rate is its peak, reached at --warmup_iters), label smoothing 0.1, dropout
0.1, a shared source/target vocabulary tied to the output layer. Batches are sentences grouped
by length (--batch_size sentences over all ranks, padded to the longest in each); the loss is
the mean over the batch's target tokens, so a data-parallel run equals one process. Needs
`pip install 'infinitrain[seq2seq]'` (sacrebleu) for the score.
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
import time


import infinitrain as it
from infinitrain import profiler
from infinitrain.amp import autocast
from infinitrain.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from infinitrain.data import LengthGroupedBatchSampler
from infinitrain.data.prepare import on_every_node, translation_file
from infinitrain.data.translation import PAD, load_translation, pad_collate
from infinitrain.io import progress
from infinitrain.utils.data import DataLoader, default_convert
from infinitrain.examples.lm_loop import ProfileWindow
from infinitrain.examples.ds_flags import (COMMON, add_config_arguments, config_schedule, same, setter,
                                          take_deepspeed_config,
                                          typed_flags)
from infinitrain.examples.flags import (add_async_tp_flag, add_monitor_flags, add_nan_check_flag, check_input_files,
                                        check_outputs, nonnegative_float, nonnegative_int, open_monitor, plan_of,
                                        positive_float, positive_int, probability, refuse, run_example,
                                        stop_if_not_finite)
from infinitrain.models.seq2seq import SEQ2SEQ_PRESETS, Seq2SeqConfig, Seq2SeqTransformer
from infinitrain.nn import functional as F
from infinitrain.nn import parallel
from infinitrain.nn.parallel.train_step import TrainStep, decay_groups
from infinitrain.optim.offload import OffloadError
from infinitrain.optim import AdamW
from infinitrain.optim.lr_scheduler import LambdaLR


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)  # a flag is its full name: the typed ones are checked
    p.add_argument("--data", default=None, help="translation_en_de.npz (default: prepared under $INFINITRAIN_DATA)")
    p.add_argument("--model", default="small", choices=sorted(SEQ2SEQ_PRESETS))
    p.add_argument("--batch_size", type=positive_int, default=64, help="sentence pairs per step over all ranks")
    p.add_argument("--grad_accumulation_steps", type=positive_int, default=1,
                   help="micro-batches each rank's share of a step is split into (gradients accumulated)")
    p.add_argument("--max_len", type=positive_int, default=64, help="longer sentences are cut to this many tokens")
    p.add_argument("--num_iteration", type=positive_int, default=1500)
    p.add_argument("--learning_rate", type=positive_float, default=1e-3, help="the schedule's peak")
    p.add_argument("--warmup_iters", type=nonnegative_int, default=200)
    p.add_argument("--weight_decay", type=nonnegative_float, default=0.0)
    p.add_argument("--adam_eps", type=positive_float, default=1e-9,
                   help="AdamW's eps (the paper's 1e-9; larger damps the round-off of near-zero second moments)")
    p.add_argument("--grad_clip", type=nonnegative_float, default=1.0, help="max gradient norm (0 = no clipping)")
    p.add_argument("--dropout", type=probability, default=0.1)
    p.add_argument("--label_smoothing", type=probability, default=0.1)
    p.add_argument("--norm_first", action="store_true", help="pre-LayerNorm blocks (the paper: post)")
    p.add_argument("--no_tie_embeddings", action="store_true", help="an output layer of its own")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--zero_stage", type=int, default=0, choices=[0, 1, 2, 3])
    p.add_argument("--offload_optimizer", default="none", choices=["none", "cpu", "nvme"],
                   help="the AdamW state in host memory (cpu, off a GPU) or in a scratch file under "
                        "--offload_path (nvme), as the language models' flag")
    p.add_argument("--offload_param", default="none", choices=["none", "cpu", "nvme"],
                   help="with --zero_stage 3: the parameters' pieces with the AdamW state, as the language "
                        "models' flag")
    p.add_argument("--offload_path", default=None, metavar="DIR", help="folder on a local disk for nvme")
    p.add_argument("--tensor_parallel", type=positive_int, default=1,
                   help="split each layer's heads and feed-forward units, and the vocabulary, over this many ranks")
    add_async_tp_flag(p)
    add_nan_check_flag(p)
    p.add_argument("--recompute", action="store_true", help="recompute each layer's activations in backward")
    p.add_argument("--val_loss_every", type=nonnegative_int, default=0, help="0 = only at the end")
    p.add_argument("--save", default=None, help="folder for checkpoints (written at the end)")
    p.add_argument("--load", default=None, help="resume from this checkpoint (or folder holding 'latest')")
    p.add_argument("--beam", type=positive_int, default=4)
    p.add_argument("--translate", type=nonnegative_int, default=0,
                   help="translate this many validation pairs at the end (0 = all)")
    p.add_argument("--num_workers", type=nonnegative_int, default=0, help="processes that collate batches ahead")
    p.add_argument("--profile", default=None, help="profile the second step: a table and this Chrome trace")
    p.add_argument("--plot", default=None, help="draw the loss curves to this image")
    add_config_arguments(p)
    add_monitor_flags(p)
    p.set_defaults(betas=(0.9, 0.98), ds_scheduler=None)  # the paper's AdamW; a config may set them
    return p.parse_args(argv)


# what a --deepspeed_config sets here (ds_flags.take_deepspeed_config)
DEEPSPEED_FLAGS = {**COMMON, "train_batch_size": ("batch_size", same), "optimizer.params.eps": ("adam_eps", same),
                   "train_micro_batch_size_per_gpu": (None, lambda v, args: None),  # batch / (accumulation x DP)
                   "gradient_accumulation_steps": ("grad_accumulation_steps", same),
                   "activation_checkpointing": ("recompute", lambda v, args: v),
                   "scheduler": (None, setter("ds_scheduler"))}


def schedule_of(args, optimizer):
    """The paper's schedule, or the DeepSpeed config's (stepped once per step as DeepSpeed does)."""
    return config_schedule(args, optimizer) or LambdaLR(optimizer, inverse_sqrt(max(args.warmup_iters, 1)))


def inverse_sqrt(warmup: int):
    """The paper's schedule as a factor of the peak: linear to 1 at `warmup`, then sqrt(warmup / step)."""
    def factor(step: int) -> float:
        s = step + 1
        return s / warmup if s < warmup else math.sqrt(warmup / s)
    return factor


@it.no_grad()
def val_loss(model, dataset, max_len: int, batch: int = 64) -> float:
    """Mean cross-entropy (no smoothing) per target token over the validation pairs."""
    model.eval()
    total, count = 0.0, 0
    for i in progress(range(0, len(dataset), batch), desc="validation loss", unit="batch"):
        src, tgt_in, tgt_out = pad_collate([dataset[j] for j in range(i, min(i + batch, len(dataset)))], max_len)
        logits, _ = model((it.from_numpy(src), it.from_numpy(tgt_in)))
        losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), it.from_numpy(tgt_out.reshape(-1)),
                                 ignore_index=PAD, reduction="sum")
        total, count = total + losses.item(), count + int((tgt_out != PAD).sum())
    model.train()
    return total / count


def bleu_table(model, vocab, dataset, args) -> str:
    import sacrebleu
    n = min(args.translate or len(dataset), len(dataset))
    pairs = [dataset[i] for i in range(n)]
    sources, refs = [vocab.decode(s) for s, _ in pairs], [vocab.decode(t) for _, t in pairs]
    model.eval()
    greedy, beam = [], []
    for i in progress(range(0, n, 32), desc="translating", unit="batch"):
        src, _, _ = pad_collate(pairs[i:i + 32], args.max_len)
        src = it.from_numpy(src)
        greedy += [vocab.decode(ids) for ids in model.greedy(src, args.max_len)]
        beam += [vocab.decode(ids) for ids in model.beam_search(src, args.beam, args.max_len)]
    scores = [sacrebleu.corpus_bleu(h, [refs]).score for h in (greedy, beam, sources)]
    lines = [f"BLEU on {n} validation pairs: greedy {scores[0]:.1f}, beam {args.beam} {scores[1]:.1f}, "
             f"copying the source {scores[2]:.1f}"]
    for i in range(min(3, n)):
        lines.append(f"  {sources[i]!r} -> {beam[i]!r} (reference {refs[i]!r})")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        env = parallel.init(args.tensor_parallel, device=args.device)
    except ValueError as e:
        refuse(f"cannot lay out the job: {e}")
    argv = sys.argv[1:] if argv is None else argv
    if take_deepspeed_config(args, argv, env.layout.dp, env.device.type, DEEPSPEED_FLAGS, env.is_main) \
            and args.ds_scheduler is not None and "warmup_iters" in typed_flags(argv):
        refuse("--warmup_iters and --deepspeed_config's scheduler both set the schedule: give one of them")
    plan = plan_of(env, zero_stage=args.zero_stage, offload_optimizer=args.offload_optimizer,
                   offload_param=args.offload_param, offload_path=args.offload_path,
                   async_tensor_parallel=not args.no_async_tensor_model_parallel_allreduce)
    dp, tp = plan.dp, plan.tensor_parallel()
    if tp is not None:  # before training, the sizes tensor parallelism splits
        preset = SEQ2SEQ_PRESETS[args.model]
        for what, n in (("the attention heads", preset["nhead"]), ("dim_feedforward", preset["dim_feedforward"])):
            if n % tp.size:
                refuse(f"--tensor_parallel {tp.size} does not divide {what} ({n}) of --model {args.model}")
    if args.batch_size % (dp * args.grad_accumulation_steps):
        refuse(f"--batch_size {args.batch_size} must be a multiple of the {dp} data-parallel ranks x "
               f"--grad_accumulation_steps {args.grad_accumulation_steps}")
    try:
        import sacrebleu  # noqa: F401  (checked before training, not after)
    except ImportError:
        refuse("the BLEU score needs sacrebleu: pip install 'infinitrain[seq2seq]'")
    if args.data is None:
        args.data = on_every_node(env, translation_file)
    check_input_files(env, [("--data", args.data, load_translation)])
    check_outputs(folders=[("--save", args.save)], files=[("--profile", args.profile), ("--plot", args.plot)],
                  plot=args.plot)
    monitor = open_monitor(args, env)
    vocab, train_set, val_set = load_translation(args.data)

    it.manual_seed(args.seed)
    config = Seq2SeqConfig(vocab_size=len(vocab), dropout=args.dropout, max_len=args.max_len,
                           norm_first=args.norm_first, tie_embeddings=not args.no_tie_embeddings,
                           label_smoothing=args.label_smoothing, **SEQ2SEQ_PRESETS[args.model])
    try:  # before training, not after it
        Seq2SeqTransformer.check_beam(config, args.beam, args.max_len)
    except MemoryError as e:
        refuse(str(e))
    model = Seq2SeqTransformer(config, tp=tp).to(env.device)
    if args.recompute:
        for layer in [*model.transformer.encoder.layers, *model.transformer.decoder.layers]:
            layer.recompute = True
    try:
        trainer = TrainStep(model, plan, decay_groups(model, args.weight_decay), AdamW,
                            lr=args.learning_rate, betas=args.betas, eps=args.adam_eps)
    except OffloadError as e:  # the disk, found too small (or failing) when its space is reserved
        sys.exit(f"rank {env.rank}: {e}")
    schedule = schedule_of(args, trainer.optimizer)
    first = 1
    if args.load:
        try:
            meta = load_checkpoint(args.load, model, trainer.optimizer)
        except CheckpointError as e:  # (every rank reads the same checkpoint, so every rank says it)
            refuse(f"cannot resume from --load {args.load}: {e}")
        first = int(meta["step"]) + 1
        if args.ds_scheduler is None:
            schedule.load_state_dict({"last_epoch": first - 1, "base_lrs": schedule.base_lrs})
        else:  # DeepSpeed's schedules count from -1: first - 1 steps taken
            schedule.load_state_dict({**schedule.state_dict(), "last_batch_iteration": first - 2})
    # One global order of length-grouped batches, the same on every rank; each rank collates
    # its share of each batch (every dp-th pair), so any DP layout trains on what one process
    # does, step by step (DistributedSampler would shard the order first and group after).
    rank = plan.coords.dp
    grouped = LengthGroupedBatchSampler(train_set.lengths(), args.batch_size, drop_last=True, seed=args.seed)
    loader = DataLoader(train_set, batch_sampler=grouped, num_workers=args.num_workers,
                        collate_fn=lambda items: default_convert(pad_collate(items[rank::dp], args.max_len)))
    if len(loader) == 0:
        refuse(f"--batch_size {args.batch_size} is larger than the training split ({len(train_set):,} pairs): "
               "no full batch to train on; use a smaller --batch_size")
    if env.is_main:
        print(f"Transformer {args.model}: {model.num_parameters():,} parameters{' on this rank' if tp else ''} | "
              f"{len(train_set):,} training, "
              f"{len(val_set):,} validation pairs, vocabulary {len(vocab):,} | {plan.describe()}", flush=True)
        if trainer.offloaded is not None:
            print(f"offload: {trainer.offloaded} per rank", flush=True)
    curves = {"train": [], "val": []}
    step, epoch, batches = first, 0, iter(())
    done, per_epoch = first - 1, len(loader)
    if done % per_epoch:  # resumed within an epoch: its batches not yet trained on, in their order
        epoch = done // per_epoch + 1
        grouped.set_epoch(epoch)
        batches = itertools.islice(iter(loader), done % per_epoch, None)
    else:
        epoch = done // per_epoch
    prof, profiling = profiler.profile(), ProfileWindow(args.profile, first, args.num_iteration, 1)
    log = print if env.is_main else (lambda *a, **k: None)  # as the language models' trainer
    while step <= args.num_iteration:
        try:
            src, tgt_in, tgt_out = next(batches)
        except StopIteration:
            epoch += 1
            grouped.set_epoch(epoch)
            batches = iter(loader)
            continue
        if profiling.starts(step):
            prof.__enter__()
        it.reset_peak_memory_stats(env.device)
        t0 = time.perf_counter()
        # the loss is the mean over the global batch's target tokens: this rank's token sum over
        # its share of them (DDP and ZeRO then average the ranks' gradients)
        mine = float((tgt_out.numpy() != PAD).sum())
        tokens = trainer.dp_mean(mine) * dp
        # with accumulation each micro-batch's loss is weighed by its tokens' share (TrainStep
        # divides each by the number of micro-batches)
        M, rows = args.grad_accumulation_steps, src.shape[0] // args.grad_accumulation_steps
        micro = []
        for j in range(M):
            part = slice(j * rows, (j + 1) * rows)
            share = float((tgt_out[part].numpy() != PAD).sum()) * M * dp / tokens
            micro.append(((src[part].to(env.device), tgt_in[part].to(env.device), share),
                          tgt_out[part].to(env.device)))
        loss, norm = trainer.step(micro, lambda: autocast(env.device.type, dtype=args.dtype,
                                                                 enabled=args.dtype != "float32"),
                                  args.grad_clip)
        stop_if_not_finite(args, env, model, step, "loss", loss)  # (a mean over the job: every rank stops)
        if norm is not None:
            stop_if_not_finite(args, env, model, step, "gradient norm", norm)
        lr = trainer.optimizer.param_groups[0]["lr"]
        schedule.step()
        ms = (time.perf_counter() - t0) * 1000
        if profiling.ends(step):
            prof.__exit__(None, None, None)
            profiling.report(prof, env, log)
        curves["train"].append((step, loss))
        if env.is_main:
            print(f"step {step:4d}/{args.num_iteration} | train loss {loss:.6f} | lr {lr:.2e} | "
                  f"({ms:.1f} ms | {tokens / ms * 1000:.0f} tok/s | DP={dp}, TP={env.layout.tp})", flush=True)
        memory = it.memory_stats(env.device)
        monitor.log(step, train_loss=loss, lr=lr, grad_norm=norm, tokens_per_s=tokens / ms * 1000,
                    peak_used_mb=memory["peak_allocated_bytes"] // 2**20,
                    peak_reserved_mb=memory["peak_reserved_bytes"] // 2**20)
        if (args.val_loss_every and step % args.val_loss_every == 0) or step == args.num_iteration:
            with trainer.gathered_parameters():
                v = val_loss(model, val_set, args.max_len)
            curves["val"].append((step, v))
            if env.is_main:
                print(f"val loss {v:.4f}", flush=True)
            monitor.log(step, val_loss=v)
        step += 1
    monitor.close()
    if args.save:
        try:
            save_checkpoint(args.save, args.num_iteration, model, trainer.optimizer, write=plan.writes_files)
        except CheckpointError as e:  # a full or read-only disk, on the writing rank: the job ends (exit_job)
            sys.exit(f"--save: {e}")
        if env.is_main:
            print(f"saved {args.save}", flush=True)
    with trainer.gathered_parameters():
        if plan.coords.dp == 0:  # the first model replica (all its TP ranks decode together)
            table = bleu_table(model, vocab, val_set, args)
            if env.is_main:
                print(table, flush=True)
    if args.plot and env.is_main:
        from infinitrain.plot import plot_losses
        plot_losses({"Transformer": curves}, args.plot, f"Transformer {args.model}")
    env.world.barrier()
    return 0


if __name__ == "__main__":
    run_example(main)
