"""Mixtures of experts measured, in one run:

1. dense against MoE at the same active parameters: LLaMA-3 `small` (a dense SwiGLU of width
   704) against `moe-small` with 8 experts of width 352 and top-2 routing (every token goes
   through 2 x 352 = 704 of expert width, plus an 8-wide router), trained through the example's
   front door on one process; then the MoE on 2 and 4 ranks without expert parallelism (EP 1:
   every rank holds every expert) and with EP 2 and EP 4 (each rank holds 8/EP experts): the
   median tokens/s over the steps after the first and rank 0's `peak used` (weights, gradients,
   AdamW state and activations) from the log line.
2. the all-to-all's share of an expert-parallel step: under `mpiexec -n EP`, forward + backward
   of the same MoE model with the profiler on: the time in all_to_all_single (the counts'
   exchange and the rows', dispatch and combine, forward and backward) against the step's
   wall time, and how much of it the profiler saw beside kernels (the dispatch waits for its
   rows before the experts run: none of it is hidden today).
3. the grouped GEMM against one product per expert: benchmarks/moe_grouped_gemm.py.

    python benchmarks/moe_train.py                       # T 256, 4 sequences per rank
    python benchmarks/moe_train.py --seq 128 --steps 3   # quicker

Ranks beyond the machine's cores share them: compare memory there, and speed only where
ranks x threads <= cores.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

from mpi_launch import start as launch

SAME_ACTIVE = ["--moe_ffn_hidden", "352"]  # 2 x 352 = the dense small's 704


def train_run(args, model: str, ranks: int, ep: int, shard: str, extra=()) -> tuple:
    tokens = args.batch * args.seq * ranks
    cmd = [*launch(ranks), sys.executable, "-m", "infinitrain.examples.llama3", "--model", model,
           "--input_bin", shard, "--batch_size", str(args.batch), "--sequence_length", str(args.seq),
           "--total_batch_size", str(tokens), "--num_iteration", str(args.steps), "--expert_parallel", str(ep),
           "--peak_tflops", "1", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                         env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    rates = [float(x) for x in re.findall(r"\| (\d+) tok/s", out.stdout)][1:]
    peak = max(int(x) for x in re.findall(r"peak used:\s+(\d+) MB", out.stdout))
    params = re.search(r"\| ([\d,]+) parameters \|", out.stdout).group(1)
    return statistics.median(rates), peak, params


def speed_and_memory(args) -> None:
    from infinitrain.data import write_shard
    import numpy as np
    shard = os.path.join(tempfile.mkdtemp(), "tokens.bin")
    write_shard(shard, np.random.default_rng(0).integers(0, 50257, 200_000))
    print(f"LLaMA-3 small, {args.batch} x {args.seq} tokens per rank per step, fp32 AdamW, {args.threads} thread(s) "
          f"per rank, {os.cpu_count()} cores")
    print(f"{'model':>36} | {'ranks':>5} | {'EP':>3} | {'parameters':>11} | {'tok/s':>7} | {'peak MB/rank':>12}")
    rows = [("dense small (FFN 704)", "small", 1, 1, ()),
            ("MoE 8 x 352, top 2 (active 704)", "moe-small", 1, 1, SAME_ACTIVE)]
    for n in args.ranks:
        rows += [("MoE 8 x 352, top 2", "moe-small", n, 1, SAME_ACTIVE),
                 ("MoE 8 x 352, top 2", "moe-small", n, n, SAME_ACTIVE)]
    for name, model, n, ep, extra in rows:
        rate, peak, params = train_run(args, model, n, ep, shard, extra)
        print(f"{name:>36} | {n:5d} | {ep:3d} | {params:>11} | {rate:7.0f} | {peak:12d}", flush=True)


def all_to_all_share(args) -> None:
    """Under mpiexec -n EP: rank 0 prints the all-to-all's share of a forward + backward."""
    import time
    import numpy as np
    import infinitrain as it
    from infinitrain import profiler
    from infinitrain.models.llama3 import llama3
    from infinitrain.nn import parallel
    from mpi4py import MPI
    n = MPI.COMM_WORLD.Get_size()
    env = parallel.init(expert_parallel=n)
    plan = parallel.ParallelPlan(env)
    model = llama3("moe-small", ep=plan.expert_parallel(), moe_ffn_hidden=352)
    data = np.random.default_rng(env.rank).integers(0, 50257, (args.batch, args.seq + 1))
    idx, targets = it.from_numpy(data[:, :-1].copy()), it.from_numpy(data[:, 1:].copy())
    model(idx, targets, return_logits=False)[1].backward()  # warm-up
    env.world.barrier()
    with profiler.profile() as prof:
        start = time.perf_counter()
        for _ in range(args.repeat):
            model(idx, targets, return_logits=False)[1].backward()
        wall = (time.perf_counter() - start) / args.repeat
    comm = sum(r["total_ns"] for r in prof.key_averages()
               if r["category"] == "comm" and r["name"] == "all_to_all_single") / 1e9 / args.repeat
    overlap = prof.communication_overlap()
    t = it.tensor([wall, comm], dtype=it.float64)
    every = it.empty(n, 2, dtype=it.float64)
    env.world.all_gather(every, t)
    if env.rank == 0:
        w, c = every.numpy().mean(0)
        print(f"EP {n}: forward + backward {w * 1e3:.1f} ms, all-to-all {c * 1e3:.1f} ms ({100 * c / w:.1f} % of the "
              f"step; mean over ranks); the profiler's overlap of communication with kernels: {overlap}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads per rank")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--share", action="store_true", help="(internal) the all-to-all share, under mpiexec")
    args = p.parse_args()
    if args.share:
        return all_to_all_share(args)
    speed_and_memory(args)
    for n in args.ranks:
        out = subprocess.run([*launch(n), sys.executable, __file__, "--share", "--batch", str(args.batch), "--seq",
                              str(args.seq), "--repeat", str(args.repeat)], capture_output=True, text=True,
                             timeout=3600, env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
        if out.returncode:
            raise SystemExit(out.stdout[-2000:] + out.stderr[-2000:])
        print(out.stdout, end="", flush=True)


if __name__ == "__main__":
    main()
