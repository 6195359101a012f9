"""GPT-2 training throughput and peak memory: infinitrain against PyTorch on the same
configuration, threads and data, each run in a fresh process; on a GPU also MFU.

    python benchmarks/gpt2_train.py                      # CPU: small and 124M, 1 and 2 threads
    python benchmarks/gpt2_train.py --configs small --threads 2 --steps 5
    python benchmarks/gpt2_train.py --threads 2 --torch stock tuned compiled   # against the best
    python benchmarks/gpt2_train.py --device cuda --dtype bfloat16 --configs 124M --B 16 --T 1024   # a GPU

Configurations: small = 4 layers, 256 wide, seq 256, batch 8; 124M = GPT-2 (d12), seq 256, batch 4
(--B and --T set the batch and sequence of every configuration run: a GPU wants 16 x 1024, llm.c's
size per GPU); vocab 50257 (infinitrain pads it to 50304 as llm.c does), AdamW; --dtype bfloat16 is
autocast in both. PyTorch runs as configured by --torch: `stock`; `tuned` (glibc malloc told never
to give memory back or map it afresh: MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_ huge); `compiled`
(tuned, plus torch.compile of the model and AdamW(fused=True)); the ratio is taken against the
fastest (on a GPU by default stock, i.e. eager, and compiled). Prints median tok/s over the measured
steps (after warm-up; with --rounds N the best of N rounds that run the frameworks in turn, so that
on a shared machine each sees the same load), peak memory (RSS of the process on the CPU, the
allocator's peak on a GPU), the ratios, and with --device cuda the model FLOPs utilisation (llm.c's
count) against --peak_tflops (default 989, an H100 SXM's dense bf16). Needs PyTorch
(`pip install '.[compare]'`; a CUDA build of it for --device cuda).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CONFIGS = {"small": dict(model="small", B=8, T=256), "124M": dict(model="gpt2", B=4, T=256)}


TORCH_VARIANTS = ("stock", "tuned", "compiled")
TUNED_MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


def shape(config: str, B: int | None, T: int | None) -> tuple[int, int]:
    """The batch and sequence a configuration runs at: its own unless --B / --T say otherwise."""
    cfg = CONFIGS[config]
    return B or cfg["B"], T or cfg["T"]


def child(framework: str, config: str, threads: int, steps: int, warmup: int, device: str, dtype: str,
          B: int | None = None, T: int | None = None) -> dict:
    import resource
    import time

    import numpy as np
    cfg = CONFIGS[config]
    B, T = shape(config, B, T)
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 50257, (B, T + 1)) for _ in range(warmup + steps)]
    times = []
    if framework == "infinitrain":
        import infinitrain as it
        from infinitrain.models import gpt2
        it.manual_seed(0)
        model = gpt2(cfg["model"]).to(device)
        opt = it.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0)
        for b in batches:
            x, y = it.from_numpy(b[:, :-1].copy()).to(device), it.from_numpy(b[:, 1:].copy()).to(device)
            t0 = time.perf_counter()
            with it.autocast(device.split(":")[0], dtype=dtype, enabled=dtype != "float32"):
                _, loss = model(x, y, return_logits=False)
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()
            times.append(time.perf_counter() - t0)
    else:
        import torch
        torch.set_num_threads(threads)
        sys.path.insert(0, str(Path(__file__).parent))
        from torch_gpt2 import TorchGPT2
        from infinitrain.models import GPT2_PRESETS
        c = GPT2_PRESETS[cfg["model"]]
        torch.manual_seed(0)
        # the unpadded vocabulary, as a PyTorch user would write it (padding only adds work there)
        model = TorchGPT2(c.n_layer, c.n_head, c.n_embd, c.vocab_size, c.block_size, c.vocab_size).to(device)
        compiled = framework == "torch-compiled"
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0,
                                **({"fused": True} if compiled else {}))
        if compiled:
            model = torch.compile(model)  # compiles during the warm-up steps
        for b in batches:
            x, y = torch.from_numpy(b[:, :-1].copy()).to(device), torch.from_numpy(b[:, 1:].copy()).to(device)
            t0 = time.perf_counter()
            with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=dtype != "float32"):
                loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss.item()
            times.append(time.perf_counter() - t0)
    measured = sorted(times[warmup:])
    median = measured[len(measured) // 2]
    if device == "cpu":
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    elif framework == "infinitrain":
        peak = it.cuda.max_memory_allocated(device) / 2**20
    else:
        peak = torch.cuda.max_memory_allocated(device) / 2**20
    return {"tok_s": B * T / median, "ms": median * 1e3, "rss_mb": peak}


def run_child(a, fw: str, config: str, n: int) -> dict:
    """One framework's measurement in a fresh process."""
    env = dict(os.environ, OMP_NUM_THREADS=str(n), OPENBLAS_NUM_THREADS=str(n))
    if fw in ("torch-tuned", "torch-compiled"):
        env.update(TUNED_MALLOC)
    out = subprocess.run([sys.executable, __file__, "--steps", str(a.steps), "--warmup",
                          str(a.warmup), "--device", a.device, "--dtype", a.dtype,
                          *(["--B", str(a.B)] if a.B else []), *(["--T", str(a.T)] if a.T else []),
                          "--child", fw, config, str(n)],
                         env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{fw} {config} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--peak_tflops", type=float, default=989.0, help="the GPU's peak for MFU")
    p.add_argument("--torch", nargs="*", default=None, choices=TORCH_VARIANTS,
                   help="PyTorch configurations to run; the ratio is against the fastest "
                        "(default: stock on the CPU, stock and compiled on a GPU)")
    p.add_argument("--B", type=int, default=None, help="batch size of every configuration run (default: its own)")
    p.add_argument("--T", type=int, default=None, help="sequence length of every configuration run (default: its own)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every framework this many times, interleaved, and keep each one's best round "
                        "(on a shared machine the rounds see the same load)")
    p.add_argument("--child", nargs=3, metavar=("FRAMEWORK", "CONFIG", "THREADS"), help=argparse.SUPPRESS)
    a = p.parse_args()
    for flag in ("B", "T", "rounds"):
        if getattr(a, flag) is not None and getattr(a, flag) < 1:
            p.error(f"--{flag} must be at least 1, got {getattr(a, flag)}")
    if a.T is not None:
        from infinitrain.models import GPT2_PRESETS
        for config in a.configs:
            block = GPT2_PRESETS[CONFIGS[config]["model"]].block_size
            if a.T > block:
                p.error(f"--T {a.T} is longer than configuration {config}'s block size {block}")
    if a.child:
        print(json.dumps(child(a.child[0], a.child[1], int(a.child[2]), a.steps, a.warmup, a.device, a.dtype,
                               a.B, a.T)))
        return
    gpu = a.device.startswith("cuda")
    if a.torch is None:
        a.torch = ["stock", "compiled"] if gpu else ["stock"]
    if gpu:
        import infinitrain as it
        if not it.cuda.is_available():
            sys.exit(f"--device {a.device}: no CUDA device here ({it.build_info().split('CUDA: ', 1)[-1]})")
        a.threads = [1]  # the host threads hardly matter on a GPU
    shapes = ", ".join(f"{c} at B {shape(c, a.B, a.T)[0]} x T {shape(c, a.B, a.T)[1]}" for c in a.configs)
    print(f"{a.device}, {a.dtype}; {shapes}")
    torch_cols = "".join(f" {v + ' tok/s':>14s}" for v in a.torch)
    print(f"{'config':7s} {'threads':>7s} | {'infinitrain tok/s':>17s} {'peak mem':>9s} | PyTorch"
          f"{torch_cols} {'peak mem':>9s} | {'speed':>6s} {'memory':>6s}" + (" | MFU it / torch" if gpu else ""))
    for config in a.configs:
        for n in a.threads:
            runs = {}  # framework -> one result per round; the rounds interleave the frameworks
            for _ in range(a.rounds):
                for fw in ["infinitrain"] + [f"torch-{v}" for v in a.torch]:
                    runs.setdefault(fw, []).append(run_child(a, fw, config, n))
            res = {fw: max(r, key=lambda x: x["tok_s"]) for fw, r in runs.items()}
            i = res["infinitrain"]
            t = max((res[f"torch-{v}"] for v in a.torch), key=lambda r: r["tok_s"])
            cols = "".join(f" {res[f'torch-{v}']['tok_s']:14.0f}" for v in a.torch)
            mfu = ""
            if gpu:
                from infinitrain.examples.mfu import flops_per_token
                from infinitrain.models import GPT2, GPT2_PRESETS
                c = GPT2_PRESETS[CONFIGS[config]["model"]]
                f = flops_per_token(GPT2._llmc_numel(c), c.n_layer, c.n_embd, shape(config, a.B, a.T)[1])
                peak = a.peak_tflops * 1e12
                mfu = f" | {100 * f * i['tok_s'] / peak:5.1f}% / {100 * f * t['tok_s'] / peak:5.1f}%"
            print(f"{config:7s} {n:7d} | {i['tok_s']:17.0f} {i['rss_mb']:7.0f}MB |        {cols} "
                  f"{t['rss_mb']:7.0f}MB | {i['tok_s'] / t['tok_s']:5.2f}x {i['rss_mb'] / t['rss_mb']:5.2f}x{mfu}",
                  flush=True)


if __name__ == "__main__":
    main()
