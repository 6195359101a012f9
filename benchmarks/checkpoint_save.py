"""What a checkpoint costs the training loop: GPT-2 trained through the example's front door
with no checkpoints, a synchronous save every --every steps, and an --async_save every --every
steps, each a fresh job on the same data. Prints the wall time per step over the run (the
step's own time plus whatever the save held it up), and the overhead against no saves.

    python benchmarks/checkpoint_save.py                     # GPT-2 small, save every step
    python benchmarks/checkpoint_save.py --model d12 --steps 6 --every 2
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time


def run(args, flags) -> tuple:
    cmd = [sys.executable, "-m", "infinitrain.examples.gpt2", "--model", args.model, "--batch_size",
           str(args.batch), "--sequence_length", str(args.seq), "--num_iteration", str(args.steps),
           "--peak_tflops", "1", *flags]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=os.environ)
    wall = time.perf_counter() - t0
    if out.returncode:
        raise SystemExit(out.stdout[-2000:] + out.stderr[-2000:])
    stamps = [float(x) for x in re.findall(r"\((\d+\.\d+) ms \|", out.stdout)]
    return wall, sum(stamps) / 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--every", type=int, default=1, help="save every this many steps")
    args = p.parse_args()
    print(f"GPT-2 {args.model}, {args.batch} x {args.seq} tokens, {args.steps} steps, a save every "
          f"{args.every} step(s), {os.environ.get('OMP_NUM_THREADS', os.cpu_count())} threads")
    with tempfile.TemporaryDirectory() as d:
        runs = {"no checkpoints": [],
                "synchronous save": ["--save", f"{d}/sync", "--save_interval", str(args.every)],
                "--async_save": ["--save", f"{d}/async", "--save_interval", str(args.every), "--async_save"]}
        base = None
        print(f"{'':>17} | {'job s':>6} | {'steps s':>7} | {'s per step':>10} | {'overhead':>8}")
        for name, flags in runs.items():
            wall, steps = run(args, flags)
            base = base if base is not None else wall
            print(f"{name:>17} | {wall:6.2f} | {steps:7.2f} | {wall / args.steps:10.3f} | "
                  f"{(wall - base) / args.steps * 1e3:6.0f} ms", flush=True)


if __name__ == "__main__":
    main()
