"""Tensor-parallel training throughput and per-rank peak memory: GPT-2 small trained through
the example's front door at TP 1, 2, 4 (± SP, × DP) on the same global batch, each a fresh
`mpiexec` job. Prints the median tokens/s over the steps after the first and the largest
per-rank `peak used` of the log line (the native allocator's peak of tensor memory). Each
layout with TP > 1 runs twice: with backward's TP collectives beside its products (the default)
and one after the other (--no_async_tensor_model_parallel_allreduce); the last column is their
ratio.

    python benchmarks/tp_train.py                                 # default layouts
    python benchmarks/tp_train.py --layouts 1x1 2x1 2x1sp --steps 6 --model small

A layout is TPxDP, `sp` appended for sequence parallelism; ranks = TP * DP, each with
--threads OpenMP threads (on a machine with fewer cores than ranks x threads the figures show
the overhead of the layout rather than its speed-up).
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

from mpi_launch import start


def run(layout: str, args, overlap: bool = True) -> tuple:
    m = re.fullmatch(r"(\d+)x(\d+)(sp)?", layout)
    if not m:
        raise SystemExit(f"layout {layout!r} is not TPxDP[sp], e.g. 2x1sp")
    tp, dp, sp = int(m.group(1)), int(m.group(2)), bool(m.group(3))
    n = tp * dp
    if args.batch % dp:
        raise SystemExit(f"global batch {args.batch} is not divisible by DP {dp}")
    cmd = [*start(int(str(n))), sys.executable, "-m",
           "infinitrain.examples.gpt2", "--model", args.model, "--batch_size", str(args.batch // dp),
           "--sequence_length", str(args.seq), "--num_iteration", str(args.steps),
           "--tensor_parallel", str(tp)] + (["--sequence_parallel"] if sp else []) \
        + ([] if overlap else ["--no_async_tensor_model_parallel_allreduce"])
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    steps = re.findall(r"\| ([\d.]+) tok/s \| MFU [\d.]+% \| peak used: +(\d+) MB", out.stdout)
    toks = [float(t) for t, _ in steps[1:]] or [float(steps[0][0])]
    return tp, dp, sp, statistics.median(toks), max(int(mb) for _, mb in steps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layouts", nargs="+", default=["1x1", "2x1", "2x1sp", "4x1", "4x1sp", "2x2"])
    p.add_argument("--model", default="small")
    p.add_argument("--batch", type=int, default=8, help="global batch, sequences")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads per rank")
    args = p.parse_args()
    print(f"GPT-2 {args.model}, global batch {args.batch} x {args.seq} tokens, fp32 AdamW, "
          f"{args.threads} thread(s) per rank, {os.cpu_count()} cores")
    print(f"{'TP':>3} {'DP':>3} {'SP':>3} | {'tok/s':>8} | {'peak MB/rank':>12} | "
          f"{'not overlapped: tok/s':>21} | {'peak MB':>7} | overlap gain")
    for layout in args.layouts:
        tp, dp, sp, toks, mb = run(layout, args)
        line = f"{tp:3d} {dp:3d} {'yes' if sp else 'no':>3} | {toks:8.0f} | {mb:12d}"
        if tp > 1:
            *_, toks_plain, mb_plain = run(layout, args, overlap=False)
            line += f" | {toks_plain:21.0f} | {mb_plain:7d} | {toks / toks_plain:.3f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
