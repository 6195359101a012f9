"""What Python costs: GPT-2 trained by the C host (examples/c_host/train_gpt2.c, the library's ABI
driven from C) against the Python engine (python -m infinitrain.examples.gpt2) at the same
checkpoint, shard, batch and AdamW settings, each a fresh process, interleaved round by round
so that a busy machine slows both alike.

    python benchmarks/c_host.py                           # GPT-2 124M, B 4 x T 256, 2 threads
    python benchmarks/c_host.py --model small --steps 6 --rounds 3

Each process reports its own step time (the whole step: batch, forward, backward, AdamW); the
first --warmup steps of each run are left out, and the median over the rest of every round is
printed with tokens/s, the Python engine's time over the C host's, and the largest relative
difference between their per-step losses (they run the same kernels in the same order, so it
should be at float32 round-off). The checkpoint is GPT-2's initialisation (seed 0) written in
llm.c's format; the shard holds random GPT-2 token ids. Needs a C compiler.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
C_STEP = re.compile(r"^step \d+: train loss (\S+) \(took (\S+) ms\)$", re.M)
PY_STEP = re.compile(r"^step +\d+/\d+ \| train loss (\S+) \| .*?\((\S+) ms \|", re.M)


def build(workdir: Path) -> Path:
    from infinitrain import config
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("no C compiler (cc or gcc) to build examples/c_host/train_gpt2.c")
    exe = workdir / "train_gpt2"
    subprocess.run([cc, "-O2", str(ROOT / "examples" / "c_host" / "train_gpt2.c"), *config.cflags().split(),
                    *config.libs().split(), "-lm", "-o", str(exe)], check=True)
    return exe


def write_inputs(workdir: Path, model: str, tokens: int) -> tuple:
    from infinitrain.data import write_shard
    from infinitrain.models import GPT2, GPT2_PRESETS
    checkpoint, shard = workdir / f"{model}.bin", workdir / f"train_{tokens}.bin"
    if not checkpoint.exists():
        GPT2(GPT2_PRESETS[model], seed=0).save_llmc(checkpoint)
    if not shard.exists():
        write_shard(shard, np.random.default_rng(0).integers(0, 50257, tokens))
    return checkpoint, shard


def run(cmd, pattern, env) -> tuple:
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    steps = pattern.findall(out.stdout)
    if out.returncode != 0 or not steps:
        sys.exit(f"{' '.join(map(str, cmd))} failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return [float(loss) for loss, _ in steps], [float(ms) for _, ms in steps]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2", help="a GPT-2 preset (default gpt2: 124M)")
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--sequence_length", type=int, default=256)
    p.add_argument("--steps", type=int, default=6, help="steps per run")
    p.add_argument("--warmup", type=int, default=2, help="first steps of each run left out")
    p.add_argument("--rounds", type=int, default=2, help="C host, then Python, this many times")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--learning_rate", default="1e-4")
    p.add_argument("--workdir", default=None, help="where the build, checkpoint and shard go (default: a temp folder)")
    a = p.parse_args()
    if a.steps <= a.warmup:
        p.error(f"--steps {a.steps} leaves nothing measured after --warmup {a.warmup}")
    workdir = Path(a.workdir or tempfile.mkdtemp(prefix="c_host_bench_"))
    workdir.mkdir(parents=True, exist_ok=True)
    B, T = a.batch_size, a.sequence_length
    exe = build(workdir)
    checkpoint, shard = write_inputs(workdir, a.model, B * T * a.steps + 1)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads))
    c_cmd = [exe, "-e", checkpoint, "-i", shard, "-b", B, "-t", T, "-n", a.steps, "-l", a.learning_rate]
    py_cmd = [sys.executable, "-m", "infinitrain.examples.gpt2", "--llmc_filepath", checkpoint, "--input_bin", shard,
              "--batch_size", B, "--sequence_length", T, "--num_iteration", a.steps, "--learning_rate",
              a.learning_rate, "--peak_tflops", "1"]  # (a given peak: no measurement at start)
    print(f"GPT-2 {a.model}, B {B} x T {T}, {a.threads} threads, float32, {a.rounds} interleaved rounds of "
          f"{a.steps} steps ({a.warmup} warm-up)")
    times = {"C host": [], "Python": []}
    for r in range(a.rounds):
        c_losses, c_ms = run(c_cmd, C_STEP, env)
        py_losses, py_ms = run(py_cmd, PY_STEP, env)
        times["C host"] += c_ms[a.warmup:]
        times["Python"] += py_ms[a.warmup:]
        diff = np.max(np.abs(np.array(py_losses) - c_losses) / np.abs(c_losses))
        print(f"round {r + 1}: C host {np.median(c_ms[a.warmup:]):.1f} ms, Python {np.median(py_ms[a.warmup:]):.1f} ms "
              f"per step; losses {c_losses[0]:.6f} .. {c_losses[-1]:.6f}, largest relative difference {diff:.1e}",
              flush=True)
    print(f"{'':8s} {'ms/step':>9s} {'tok/s':>8s}")
    for name, ms in times.items():
        print(f"{name:8s} {np.median(ms):9.1f} {B * T / np.median(ms) * 1e3:8.0f}")
    ratio = np.median(times["Python"]) / np.median(times["C host"])
    print(f"Python / C host step time: {ratio:.3f} ({100 * (ratio - 1):+.1f}%)")


if __name__ == "__main__":
    main()
