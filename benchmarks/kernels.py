"""Kernel benchmark: matmul GFLOP/s against numpy.matmul, and GB/s of the memory-bound
kernels (LayerNorm, softmax, cross-entropy, AdamW) against the machine's copy bandwidth.

    python benchmarks/kernels.py              # 1 and 2 threads
    python benchmarks/kernels.py --threads 4

Each thread count runs in a fresh process with OMP_NUM_THREADS and OPENBLAS_NUM_THREADS set,
so numpy's OpenBLAS and ours use the same number of threads. Figures are the best of repeated
runs after a warm-up, for both sides. This prints numbers; it asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def timeit(fn, repeat: int = 7, min_time: float = 0.2) -> float:
    """Best seconds per call over `repeat` samples (as STREAM reports: the least disturbed)."""
    fn()
    n = 1
    while True:  # calls per sample, so that a sample lasts long enough to time
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t0 > min_time / repeat or n > 1000:
            break
        n *= 2
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n)
    return min(samples)


def run(threads: int) -> None:
    import numpy as np

    import infinitrain as it
    from infinitrain._native import lib
    from infinitrain.kernels import neural as nn, optim

    print(f"\n== {threads} thread(s) == {it.build_info()}")
    rows = []

    def row(name, seconds, work, unit, ref=None):
        rate = work / seconds / 1e9
        extra = f"  ({rate / ref:6.1%} of reference)" if ref else ""
        rows.append(rate)
        print(f"  {name:46s} {seconds * 1e3:9.3f} ms  {rate:8.2f} {unit}{extra}")
        return rate

    # ---- copy bandwidth: the yardstick for memory-bound kernels ----
    n = 64 << 20  # 256 MB of float32
    src, dst = it.randn(n), it.empty(n)
    a, b = np.random.rand(n).astype(np.float32), np.empty(n, np.float32)
    t_np = timeit(lambda: np.copyto(b, a), repeat=5)
    t_it = timeit(lambda: lib.it_memcpy(src.device.native, dst._ptr(), src.device.native, src._ptr(), n * 4), repeat=5)
    copy_bw = max(2 * n * 4 / t_np, 2 * n * 4 / t_it) / 1e9
    row("copy 256 MB, numpy.copyto (read+write)", t_np, 2 * n * 4, "GB/s")
    row("copy 256 MB, it_memcpy (read+write)", t_it, 2 * n * 4, "GB/s")
    del src, dst, a, b

    # ---- matmul ----
    for (m, k, nn_), label in [((1024, 1024, 1024), "matmul 1024^3"),
                               ((2048, 768, 2304), "matmul 2048x768 @ 768x2304 (GPT-2 qkv)"),
                               ((2048, 3072, 768), "matmul 2048x3072 @ 3072x768 (GPT-2 proj)")]:
        A, B = np.random.rand(m, k).astype(np.float32), np.random.rand(k, nn_).astype(np.float32)
        tA, tB = it.from_numpy(A), it.from_numpy(B)
        flops = 2 * m * k * nn_
        ref = flops / timeit(lambda: np.matmul(A, B)) / 1e9
        print(f"  {label + ', numpy.matmul':46s} {flops / ref / 1e6:9.3f} ms  {ref:8.2f} GFLOP/s")
        row(label + ", infinitrain", timeit(lambda: tA @ tB), flops, "GFLOP/s", ref)
        bA, bB = tA.bfloat16(), tB.bfloat16()
        row(label + ", infinitrain bf16", timeit(lambda: bA @ bB), flops, "GFLOP/s", ref)

    # ---- memory-bound kernels, in GB/s of compulsory traffic ----
    B, T, C = 8, 1024, 768
    x, w, bias, g = it.randn(B, T, C), it.randn(C), it.randn(C), it.randn(B, T, C)
    out, mean, rstd = nn.layer_norm(x, w, bias)
    row("layernorm fwd 8x1024x768", timeit(lambda: nn.layer_norm(x, w, bias)), 2 * x.nbytes, "GB/s", copy_bw)
    row("layernorm bwd 8x1024x768", timeit(lambda: nn.layer_norm_backward(g, x, w, mean, rstd)),
        3 * x.nbytes, "GB/s", copy_bw)
    xb, wb, bb = x.bfloat16(), w.bfloat16(), bias.bfloat16()
    row("layernorm fwd 8x1024x768 bf16", timeit(lambda: nn.layer_norm(xb, wb, bb)), 2 * xb.nbytes, "GB/s", copy_bw)
    del x, g, out, xb

    N, V, Vp = 1024, 50257, 50304
    logits = it.randn(N, Vp)
    targets = it.tensor(np.random.randint(0, V, N))
    sm = logits[:, :V].contiguous()
    row("softmax fwd 1024x50257", timeit(lambda: nn.softmax(sm)), 2 * sm.nbytes, "GB/s", copy_bw)
    probs = nn.softmax(sm)
    row("softmax bwd 1024x50257", timeit(lambda: nn.softmax_backward(probs, probs)), 3 * sm.nbytes, "GB/s", copy_bw)
    losses, lse = nn.cross_entropy(logits, targets, V)
    dl = it.full((N,), 1.0 / N)
    row("cross-entropy fwd 1024x50257", timeit(lambda: nn.cross_entropy(logits, targets, V)), logits.nbytes, "GB/s",
        copy_bw)
    row("cross-entropy bwd 1024x50257", timeit(lambda: nn.cross_entropy_backward(dl, logits, lse, targets, V)),
        2 * logits.nbytes, "GB/s", copy_bw)
    del logits, sm, probs

    P = 32 << 20  # 32M parameters
    p, grad, m1, v1 = it.randn(P), it.randn(P), it.zeros(P), it.zeros(P)
    step = [0]

    def adamw():
        step[0] += 1
        optim.adamw_step(p, grad, m1, v1, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, step=step[0])
    row("adamw 32M params (fp32)", timeit(adamw, repeat=5), 7 * 4 * P, "GB/s", copy_bw)

    q, k, v = it.randn(4, 12, 256, 64), it.randn(4, 12, 256, 64), it.randn(4, 12, 256, 64)
    o, l2 = nn.attention(q, k, v)
    flops = 4 * 4 * 12 * 256 * 256 * 64  # QK^T and PV, full square
    row("attention fwd B4 H12 T256 D64", timeit(lambda: nn.attention(q, k, v)), flops, "GFLOP/s")
    row("attention bwd B4 H12 T256 D64", timeit(lambda: nn.attention_backward(q, q, k, v, o, l2)),
        2 * flops, "GFLOP/s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        run(a.threads[0])
        return
    for n in a.threads:
        env = dict(os.environ, OMP_NUM_THREADS=str(n), OPENBLAS_NUM_THREADS=str(n))
        subprocess.run([sys.executable, __file__, "--child", "--threads", str(n)], env=env, check=True)


if __name__ == "__main__":
    main()
