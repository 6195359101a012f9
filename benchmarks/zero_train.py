"""ZeRO stages compared on one data-parallel job: GPT-2 trained through the example's front door
with --zero_stage 0 (DDP), 1, 2 and 3 on the same global batch, each a fresh `mpiexec` job. Prints
the median tokens/s over the steps after the first and rank 0's `peak used` (the native
allocator's peak of tensor memory), also as bytes per parameter.

    python benchmarks/zero_train.py                        # DP 4, GPT-2 small
    python benchmarks/zero_train.py --dp 2 --model tiny --stages 0 2

"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

from mpi_launch import start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small")
    p.add_argument("--dp", type=int, default=4)
    p.add_argument("--batch", type=int, default=2, help="sequences per rank per micro-batch")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads per rank")
    p.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3])
    args = p.parse_args()
    print(f"GPT-2 {args.model}, DP {args.dp}, {args.batch} x {args.seq} tokens per rank, fp32 AdamW, "
          f"{args.threads} thread(s) per rank, {os.cpu_count()} cores")
    print(f"{'stage':>5} | {'tok/s':>7} | {'peak MB/rank':>12} | {'bytes/param':>11}")
    for stage in args.stages:
        cmd = [*start(int(str(args.dp))), sys.executable, "-m",
               "infinitrain.examples.gpt2", "--model", args.model, "--batch_size", str(args.batch),
               "--sequence_length", str(args.seq), "--num_iteration", str(args.steps),
               "--zero_stage", str(stage)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                             env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
        if out.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        params = int(re.search(r"\| ([\d,]+) parameters", out.stdout).group(1).replace(",", ""))
        steps = re.findall(r"\| ([\d.]+) tok/s \| MFU [\d.]+% \| peak used: +(\d+) MB", out.stdout)
        toks = statistics.median(float(t) for t, _ in steps[1:] or steps)
        mb = max(int(m) for _, m in steps)
        print(f"{stage:5d} | {toks:7.0f} | {mb:12d} | {mb * 2**20 / params:11.1f}", flush=True)


if __name__ == "__main__":
    main()
