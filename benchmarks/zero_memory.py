"""Where a rank's memory goes under ZeRO 0/1/2/3: GPT-2 trained through the trainer's own step
(nn.parallel.train_step) on DP ranks, one fresh job per stage. For rank 0 it prints, from the
native allocator's counters, each component measured beside its theory: the persistent bytes
(parameters, gradients, AdamW state: what the stage promises to shard, (4 + 4 + 8) bytes per
parameter at stage 0, 4 + 4 + 8/DP at 1, 4 + (4 + 8)/DP at 2, 16/DP at 3), the activations one
forward pass keeps for backward, and what a step holds beyond those by the layout's own sizes
(the largest weight's gradient made whole, the buckets in flight, ZeRO-3's gathered units); then
the step's peak against their sum (the goal: within 15% of it).

    python benchmarks/zero_memory.py                          # DP 4, GPT-2 4 layers x 256
    python benchmarks/zero_memory.py --dp 2 --vocab 8192 --stages 0 2
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

MB = 2 ** 20
HEADER = ["stage", "params (m/t)", "grads (m/t)", "AdamW (m/t)", "persistent (m/t)", "activations",
          "gradient made", "buckets in flight", "units gathered", "   peak", "  bound", "peak/bound", "B/param"]


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dp", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--embd", type=int, default=256)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--batch", type=int, default=2, help="sequences per rank")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--stage", type=int, default=None, help=argparse.SUPPRESS)  # a job's own stage
    return p.parse_args(argv)


def _job(args) -> None:
    """One stage, run on every rank of an MPI job; rank 0 prints one table row."""
    import numpy as np

    import infinitrain as it
    from infinitrain.models import GPT2Config
    from infinitrain.models.gpt2 import GPT2
    from infinitrain.nn import parallel
    from infinitrain.nn.parallel.train_step import TrainStep, decay_groups
    from infinitrain.optim import AdamW

    env = parallel.init()
    allocated = lambda: it.memory_stats()["allocated_bytes"]  # noqa: E731
    it.manual_seed(0)
    model = GPT2(GPT2Config(block_size=args.seq, vocab_size=args.vocab, n_layer=args.layers,
                            n_head=max(1, args.embd // 64), n_embd=args.embd))
    n_params = sum(p.numel() for p in model.parameters())
    trainer = TrainStep(model, parallel.ParallelPlan(env, zero_stage=args.stage), decay_groups(model, 0.0), AdamW,
                        lr=1e-4)
    rng = np.random.default_rng(env.dp_rank)
    x = it.from_numpy(rng.integers(0, args.vocab, (args.batch, args.seq)))
    y = it.from_numpy(rng.integers(0, args.vocab, (args.batch, args.seq)))
    trainer.step([(x, y)])  # the first step creates AdamW's state
    opt = trainer.optimizer.optimizer if trainer.zero else trainer.optimizer
    state = sum(v.numel() * v.dtype.itemsize for s in (opt.state.values() if opt else ()) for v in s.values()
                if isinstance(v, it.Tensor) and v.ndim > 0)
    dp = env.layout.dp
    shard = {0: (1, 1, 1), 1: (1, 1, dp), 2: (1, dp, dp), 3: (dp, dp, dp)}[args.stage]  # params, grads, AdamW
    theory = [4 * n_params / shard[0], 4 * n_params / shard[1], 8 * n_params / shard[2]]
    if trainer.zero:
        buckets = trainer.optimizer.buckets
        params = sum(b.piece if args.stage == 3 else b.padded for b in buckets) * 4
        # stage 1: the shard is a piece of it
        grads = sum(b.padded if args.stage == 1 else b.piece for b in buckets) * 4
    else:
        buckets = []
        params = n_params * 4
        grads = sum(b.flat_grad.numel() for b in trainer.net.reducer.buffer) * 4 if env.layout.dp > 1 else n_params * 4
    transient = _transients(model, buckets, args.stage)
    persistent = allocated()
    it.reset_peak_memory_stats()
    _, loss = trainer.net(x, y, return_logits=False)  # the activations kept for backward
    activations = allocated() - persistent
    loss.backward()
    trainer.optimizer_step()
    peak = it.memory_stats()["peak_allocated_bytes"]
    if env.is_main:
        bound = sum(theory) + activations + sum(transient)
        row = [f"{m / MB:.1f}/{t / MB:.1f}" for m, t in zip((params, grads, state, persistent), (*theory, sum(theory)))]
        row += [f"{v / MB:.1f}" for v in (activations, *transient, peak, bound)]
        row += [f"{peak / bound:.2f}", f"{peak / n_params:.1f}"]
        print(" | ".join([f"{args.stage:>5}"] + [f"{v:>{len(h)}}" for v, h in zip(row, HEADER[1:])]), flush=True)


def _transients(model, buckets, stage) -> tuple:
    """What a step holds beyond the persistent state and the activations, by the layout's own
    sizes: (the largest weight gradient, made whole by its product before it lands in its
    bucket or is reduce-scattered; stages 2 and 3: two full-size buckets in flight, the largest
    but a shared parameter's (whose gradient is that first one); stage 3: the two largest units
    gathered at a time, one running and the next prefetched)."""
    made = max(p.numel() for p in model.parameters()) * 4
    regular = sorted((b.padded * 4 for b in buckets if not getattr(b, "shared", False)), reverse=True)
    in_flight = sum(regular[:2]) if stage >= 2 else 0
    gathered = sum(sorted((b.padded * 4 for b in buckets), reverse=True)[:2]) if stage == 3 else 0
    return made, in_flight, gathered


def main() -> None:
    args = _args()
    if args.stage is not None:
        return _job(args)
    from mpi_launch import start
    print(f"GPT-2 {args.layers} layers x {args.embd}, vocabulary {args.vocab}, DP {args.dp}, "
          f"{args.batch} x {args.seq} tokens per rank, fp32 AdamW; rank 0's allocator, MB")
    print(" | ".join(HEADER))
    for stage in args.stages:
        cmd = [*start(args.dp), sys.executable, __file__, *sys.argv[1:], "--stage", str(stage)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
        if out.returncode:
            raise SystemExit(f"stage {stage} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        print("\n".join(ln.split("] ", 1)[-1] for ln in out.stdout.splitlines() if "|" in ln), flush=True)
    print("m/t: measured/theory; persistent: what stays between steps (params + grads + AdamW + small "
          "buffers) against the stage's promise for those; activations: what one forward keeps for backward; "
          "gradient made: the largest weight's gradient, whole before it is reduced; buckets in flight (stages 2, 3): "
          "the two largest full-size buckets; units gathered (stage 3): the two largest; bound: the promise + "
          "activations + those three; peak/bound: the goal is at most 1.15")


if __name__ == "__main__":
    main()
