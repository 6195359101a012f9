"""How close a GPT-2 training step on the CPU is to its matrix-product ceiling: sgemm's rate at
the step's own product shapes, the step's time against its product FLOPs at that rate, and the
profiler's kernel table (self time per kernel, share of the step) for the rest.

    python benchmarks/step_ceiling.py                       # small (B 8) and 124M (B 4), T 256, 2 threads
    python benchmarks/step_ceiling.py --configs 124M --threads 1 --cpu_time

The products counted: every linear layer's forward and its two backward products (input and
weight gradients) and the tied head's, at the shapes the step runs; causal attention's 2 forward
and 5 backward products over the query blocks of 64 the kernels compute. --cpu_time measures the
process's CPU time instead of the wall clock: on a machine shared with other jobs that is the
steadier figure at one thread (at two it also counts threads spinning at a barrier). Prints the
load average beside the figures: on a loaded machine compare only the shares, not the rates.
"""
from __future__ import annotations

import argparse
import os
import time

CONFIGS = {"small": ("small", 8, 256), "124M": ("gpt2", 4, 256)}
QUERY_BLOCK = 64  # native/src/cpu/attention.c


def product_shapes(c, B: int, T: int) -> list:
    """(m, n, k, count) of every product in a step: forward y = x W^T, backward dx = dy W and
    dW = dy^T x, per linear layer, then the tied head [N, Vp]."""
    N, C = B * T, c.n_embd
    shapes = []
    for out_f, in_f in ((3 * C, C), (C, C), (4 * C, C), (C, 4 * C)):
        shapes += [(N, out_f, in_f, c.n_layer), (N, in_f, out_f, c.n_layer), (out_f, in_f, N, c.n_layer)]
    Vp = c.padded_vocab_size
    return shapes + [(N, Vp, C, 1), (N, C, Vp, 1), (Vp, C, N, 1)]


def attention_flops(c, B: int, T: int) -> int:
    one = sum(min(i0 + QUERY_BLOCK, T) * min(QUERY_BLOCK, T - i0) for i0 in range(0, T, QUERY_BLOCK))
    return 7 * 2 * one * (c.n_embd // c.n_head) * c.n_head * B * c.n_layer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--cpu_time", action="store_true", help="the process's CPU time instead of the wall clock")
    p.add_argument("--rows", type=int, default=14, help="kernel rows printed")
    a = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = str(a.threads)
    import numpy as np

    import infinitrain as it
    import infinitrain.profiler
    from infinitrain.kernels import matmul as kmm
    from infinitrain.models import GPT2_PRESETS, gpt2
    clock = time.process_time if a.cpu_time else time.perf_counter

    def best(fn, repeat):
        fn()
        times = []
        for _ in range(repeat):
            t0 = clock()
            fn()
            times.append(clock() - t0)
        return min(times)

    blas = it.build_info().split(";")[1].strip()
    print(f"{a.threads} thread(s), {'CPU time' if a.cpu_time else 'wall clock'}; {blas}")
    for config in a.configs:
        name, B, T = CONFIGS[config]
        c = GPT2_PRESETS[name]
        flops = seconds = 0.0
        for m, n, k, count in product_shapes(c, B, T):
            x, w = it.randn(m, k), it.randn(n, k)
            t = best(lambda: kmm.linear(x, w, None), 2 if m * n * k > 1e10 else 5)
            flops += 2 * m * n * k * count
            seconds += t * count
        rate = flops / seconds
        attn = attention_flops(c, B, T)

        it.manual_seed(0)
        model = gpt2(name)
        opt = it.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0)
        rng = np.random.default_rng(0)

        def step():
            b = rng.integers(0, 50257, (B, T + 1))
            x, y = it.from_numpy(b[:, :-1].copy()), it.from_numpy(b[:, 1:].copy())
            _, loss = model(x, y, return_logits=False)
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()

        step_s = best(step, a.steps)
        with it.profiler.profile() as prof:
            step()
        ceiling = (flops + attn) / rate
        print(f"\n{config} (B {B} x T {T}), load average {os.getloadavg()[0]:.1f}: sgemm at the step's shapes "
              f"{rate / 1e9:.1f} GFLOP/s; step {step_s * 1e3:.0f} ms, {(flops + attn) / 1e9:.1f} GFLOP of products "
              f"({attn / 1e9:.1f} in attention) = {ceiling * 1e3:.0f} ms at that rate: the step at "
              f"{100 * ceiling / step_s:.1f}% of the sgemm ceiling, {B * T / step_s:.0f} tok/s")
        rows = sorted((r for r in prof.key_averages() if r["category"] == "kernel"), key=lambda r: -r["self_ns"])
        wall = max(prof.wall_ns, 1)
        print(f"  {'kernel':28s} {'calls':>5s} {'self ms':>9s} {'% step':>7s}")
        for r in rows[:a.rows]:
            print(f"  {r['name'][:28]:28s} {r['calls']:5d} {r['self_ns'] / 1e6:9.1f} {100 * r['self_ns'] / wall:6.1f}%")


if __name__ == "__main__":
    main()
