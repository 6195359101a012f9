"""Pipeline schedules and layer splits compared on one job: GPipe, 1F1B, interleaved 1F1B and the
zero-bubble ZB-H1 and ZBV (backward split into B and a deferred W), each with the even and the
balanced split of the blocks (nn.parallel.pp.chunk_layers), training the
same GPT-2 on the same global batch. Per schedule: tokens/s (median over the steps after the first),
and per stage the measured bubble (the share of the step the stage sat blocked on a
neighbour), the peak tensor memory and the peak activation memory (what a step held above what
it started with). On paper (`simulate`, forward 1 : backward 2): the bubble of the split's
estimated work (each chunk's blocks, the head's blocks' worth on the last chunk, as the balanced
split counts them; a split backward's W is half of it), and the step and each stage's bubble
with the work each stage measured
(its step less its waits): the distance between that and the measured bubble is what the
engine adds (messages, waits, start-up), the rest is the split and the schedule.

    python benchmarks/pp_train.py                          # PP 4, 8 micro-batches, GPT-2 small
    python benchmarks/pp_train.py --pp 2 --micro 8 --layers 8 --seq 128
    python benchmarks/pp_train.py --schedules 1f1b zb-h1 zbv --splits balanced   # the zero-bubble table

Each schedule is a fresh `mpiexec -n PP` job running this file with --child; with fewer cores
than ranks the stages share cores and the measured bubble mixes with that contention.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from mpi_launch import start


def child(args) -> None:
    import infinitrain as it
    from infinitrain.models import gpt2
    from infinitrain.nn import parallel
    from infinitrain.nn.parallel.pp import PipelineParallel, simulate
    from infinitrain.nn.parallel.pp.schedules import placement
    from infinitrain.nn.parallel.pp.stage import global_chunk
    from infinitrain.optim import AdamW
    from mpi4py import MPI

    env = parallel.init(pipeline_parallel=args.pp)
    V = 2 if args.schedule in ("interleaved", "zbv") else 1
    plan = parallel.ParallelPlan(env, virtual_pipeline_parallel=V, pipeline_schedule=args.schedule,
                                 pipeline_split=args.split)
    sizes = {"vocab_size": args.vocab} if args.vocab else {}
    model = gpt2(args.model, pp=plan.pipeline_stage(), n_layer=args.layers, **sizes)
    pipe = PipelineParallel(model, args.schedule, deallocate_outputs=args.outputs[0] == "freed",
                            post_receives=args.receives[0] == "ahead")
    opt = AdamW(model.parameters(), lr=1e-4)
    rng = __import__("numpy").random.default_rng(0)
    b = args.batch // args.micro
    rows = []
    for step in range(args.steps):
        data = rng.integers(0, model.config.vocab_size, (args.batch, args.seq + 1))
        micro = [(it.from_numpy(data[m * b:(m + 1) * b, :-1].copy()),
                  it.from_numpy(data[m * b:(m + 1) * b, 1:].copy())) for m in range(args.micro)]
        start_bytes = it.memory_stats()["allocated_bytes"]
        it.reset_peak_memory_stats()
        env.world.barrier()
        pipe.p2p.wait_s = 0.0
        t0 = time.perf_counter()
        pipe.forward_backward(micro)
        elapsed = time.perf_counter() - t0
        peak = it.memory_stats()["peak_allocated_bytes"]
        opt.step()
        opt.zero_grad(set_to_none=False)
        rows.append((elapsed, pipe.p2p.wait_s / elapsed, peak, peak - start_bytes))
    rows = rows[1:] or rows  # the first step allocates the gradients
    mine = (statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows),
            max(r[2] for r in rows), max(r[3] for r in rows))
    every = MPI.COMM_WORLD.gather(mine, root=0)
    layers = MPI.COMM_WORLD.gather(model.stage_layers, root=0)
    if env.is_main:
        P, M = args.pp, args.micro
        # the split's work on paper: each global chunk's blocks, the head's blocks' worth on the last
        where = placement(args.schedule)
        est = [0.0] * (P * V)
        for s, chunks in enumerate(layers):
            for v, c in enumerate(chunks):
                est[global_chunk(s, v, P, where)] = len(c)
        est[-1] += type(model).head_work(model.config)
        estimated = simulate(args.schedule, P, V, M, chunk_work=est)
        # the work each stage measured (its step less its waits), shared over its chunks as
        # estimated, in seconds per forward (a backward 2 forwards)
        measured = [0.0] * (P * V)
        for s, (elapsed, wait, _, _) in enumerate(every):
            mine = [est[global_chunk(s, v, P, where)] for v in range(V)]
            for v, e in enumerate(mine):
                measured[global_chunk(s, v, P, where)] = elapsed * (1 - wait) * e / sum(mine) / (3 * M)
        paper = simulate(args.schedule, P, V, M, chunk_work=measured)
        step_s = max(r[0] for r in every)
        blocks = [sum(map(len, c)) for c in layers]
        print(f"{args.schedule:>11} {args.split:>8} {args.outputs[0]:>5} {args.receives[0]:>9} {str(blocks):>8} | "
              f"{args.batch * args.seq / step_s:6.0f} tok/s | {estimated['bubble']:4.0%} | "
              f"step {step_s * 1e3:6.0f} ms, on paper {paper['time'] * 1e3:6.0f} | " + ", ".join(
                  f"s{s} bubble {w:4.0%} (paper {pb:4.0%}) peak {p / 2**20:6.1f} MB act {a / 2**20:6.1f} MB"
                  for s, ((_, w, p, a), pb) in enumerate(zip(every, paper["stage_bubbles"]))), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=0, help="vocabulary size (0: the preset's); a small one "
                   "makes the head light, so that the stages do equal work and the schedule alone sets the bubble")
    p.add_argument("--pp", type=int, default=4)
    p.add_argument("--micro", type=int, default=8, help="micro-batches per step")
    p.add_argument("--batch", type=int, default=16, help="global batch, sequences")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads per rank")
    p.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b", "interleaved", "zb-h1", "zbv"])
    p.add_argument("--splits", nargs="+", default=["even", "balanced"],
                   help="how blocks are split over the stages (nn.parallel.pp.chunk_layers)")
    p.add_argument("--outputs", nargs="+", default=["freed"], choices=["freed", "kept"],
                   help="a chunk's sent output: its memory given back once sent (the default), or kept "
                        "until its backward (to measure what freeing saves: --outputs kept freed)")
    p.add_argument("--receives", nargs="+", default=["ahead"], choices=["ahead", "on_demand"],
                   help="each pass posting the next pass's receive before it computes (the default), or "
                        "receives posted when needed (to compare: --receives on_demand ahead)")
    p.add_argument("--split", default="balanced", help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--schedule", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.batch % args.micro:
        raise SystemExit(f"--batch {args.batch} is not a multiple of --micro {args.micro}")
    if args.child:
        return child(args)
    vocab = f", vocabulary {args.vocab}" if args.vocab else ""
    print(f"GPT-2 {args.model} with {args.layers} layers{vocab}, PP {args.pp}, {args.micro} micro-batches of "
          f"{args.batch // args.micro} x {args.seq} tokens, fp32, {args.threads} thread(s) per rank, "
          f"{os.cpu_count()} cores")
    print("   schedule    split outputs receives   blocks | throughput | bubble on paper, the split's estimated "
          "work | step measured, and on paper with the work each stage measured | per stage: measured "
          "bubble (on paper with the measured work), peaks")
    runs = [(s, split, o, r) for s in args.schedules for split in args.splits for o in args.outputs
            for r in args.receives]
    for s, split, outputs, receives in runs:
        cmd = [*start(int(str(args.pp))), sys.executable, __file__,
               "--child", "--schedule", s, "--split", split, "--outputs", outputs, "--receives", receives] + [
                   f"--{k}={v}" for k, v in vars(args).items()
                   if k in ("model", "layers", "vocab", "pp", "micro", "batch", "seq", "steps")]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                             env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
        if out.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
        print(out.stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
