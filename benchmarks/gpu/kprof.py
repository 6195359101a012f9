"""The GPU time of every kernel of one training step (train_gpu.py's step: bf16 autocast, AdamW),
read by PyTorch's profiler: CUPTI records every kernel the process launches, infinitrain's own
and cuBLAS's included. Writes a JSON object (the step's wall time, the kernels' total, each kernel's
calls and milliseconds, longest first) to --out and prints the table; needs PyTorch with CUDA
(without it: {"error": "no CUDA ..."} and exit 0).

    python benchmarks/gpu/kprof.py --framework infinitrain --model gpt2 --B 16 --T 1024 --out kernels.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from train_gpu import FRAMEWORKS, make_step, resolve


def profile_step(framework: str, model: str, B: int, T: int, dtype: str, warmup: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile
    result = dict(framework=framework, model=model, B=B, T=T, dtype=dtype)
    if not torch.cuda.is_available():
        return dict(result, error=f"no CUDA (PyTorch {torch.__version__}: no CUPTI to read kernel times)")
    torch.cuda.init()  # CUPTI attaches to the process's CUDA context before infinitrain's first kernel
    arch, _, cfg = resolve(model)
    prepare, step, _ = make_step(framework, arch, cfg, dtype)
    rng = np.random.default_rng(0)
    batches = [prepare(rng.integers(0, cfg.vocab_size, (B, T + 1))) for _ in range(warmup + 1)]
    for xy in batches[:-1]:
        step(xy)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        step(batches[-1])
        wall = time.perf_counter() - t0
    kernels = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        us = us if us is not None else getattr(e, "self_cuda_time_total", 0)
        if us > 0:
            kernels.append(dict(name=e.key, calls=e.count, ms=us / 1e3))
    kernels.sort(key=lambda k: -k["ms"])
    return dict(result, step_ms=1e3 * wall, gpu_ms=sum(k["ms"] for k in kernels), kernels=kernels)


def table(r: dict, rows: int = 30) -> str:
    if "error" in r:
        return r["error"]
    lines = [f"{r['framework']} {r['model']} {r['B']}x{r['T']}: one step {r['step_ms']:.1f} ms, "
             f"kernels {r['gpu_ms']:.1f} ms of GPU time", f"{'GPU ms':>9s} {'share':>6s} {'calls':>6s}  kernel"]
    for k in r["kernels"][:rows]:
        lines.append(f"{k['ms']:9.3f} {100 * k['ms'] / r['gpu_ms']:5.1f}% {k['calls']:6d}  {k['name'][:150]}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--framework", default="infinitrain", choices=FRAMEWORKS)
    p.add_argument("--model", default="gpt2")
    p.add_argument("--B", type=int, default=16)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--warmup", type=int, default=2, help="steps before the profiled one")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    r = profile_step(a.framework, a.model, a.B, a.T, a.dtype, a.warmup)
    print(table(r), flush=True)
    if a.out:
        a.out.write_text(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
