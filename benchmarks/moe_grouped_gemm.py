"""The experts' grouped product (one native call over every expert's rows) against one product
per expert: infinitrain's loop of linears, and PyTorch's loop of F.linear on the same shapes.
Forward and the two backward forms (dx = dy_e W_e, dW_e = dy_e^T x_e), milliseconds, best of
several runs; routing uniform at random (top-k distinct experts per token).

    python benchmarks/moe_grouped_gemm.py                      # the default shapes, float32, CPU
    python benchmarks/moe_grouped_gemm.py --dtype bfloat16 --device cuda
    python benchmarks/moe_grouped_gemm.py --experts 8 64 --tokens 4096 --top_k 2 --C 512 --F 1024

Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def best(fn, sync, repeat):
    fn()
    sync()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return min(out) * 1e3


def routed_counts(tokens, top_k, experts, rng):
    ids = np.stack([rng.choice(experts, top_k, replace=False) for _ in range(tokens)])
    return [int(c) for c in np.bincount(ids.reshape(-1), minlength=experts)]


def ours(counts, C, F, dtype, device, repeat):
    import infinitrain as it
    from infinitrain.kernels import matmul as kmm
    from infinitrain.kernels import moe as kmoe
    dt = getattr(it, dtype)
    rows = sum(counts)
    x = it.randn(rows, C, dtype=dt, device=device)
    dy = it.randn(rows, F, dtype=dt, device=device)
    ws = [it.randn(F, C, dtype=dt, device=device) * 0.05 for _ in counts]
    sync = it.cuda.synchronize if device == "cuda" else (lambda: None)
    starts = np.concatenate([[0], np.cumsum(counts)]).tolist()

    def loop_forward():
        for e, w in enumerate(ws):
            if counts[e]:
                kmm.linear(x[starts[e]:starts[e + 1]], w, None)

    def loop_backward():
        for e, w in enumerate(ws):
            if counts[e]:
                g = dy[starts[e]:starts[e + 1]]
                kmm.matmul(g, w)
                kmm.matmul(g.t(), x[starts[e]:starts[e + 1]])

    return {"grouped forward": best(lambda: kmoe.grouped_linear(x, ws, counts), sync, repeat),
            "grouped backward": best(lambda: (kmoe.grouped_linear_backward_input(dy, ws, counts),
                                              kmoe.grouped_linear_backward_weight(dy, x, counts)), sync, repeat),
            "loop forward": best(loop_forward, sync, repeat),
            "loop backward": best(loop_backward, sync, repeat)}


def torchs(counts, C, F, dtype, device, repeat):
    import torch
    import torch.nn.functional as tf
    dt = getattr(torch, dtype)
    rows = sum(counts)
    x = torch.randn(rows, C, dtype=dt, device=device)
    dy = torch.randn(rows, F, dtype=dt, device=device)
    ws = [torch.randn(F, C, dtype=dt, device=device) * 0.05 for _ in counts]
    xs, dys = torch.split(x, counts), torch.split(dy, counts)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def forward():
        for xe, w in zip(xs, ws):
            tf.linear(xe, w)

    def backward():
        for xe, ge, w in zip(xs, dys, ws):
            ge @ w
            ge.t() @ xe

    return {"torch loop forward": best(forward, sync, repeat), "torch loop backward": best(backward, sync, repeat)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experts", type=int, nargs="+", default=[8, 64])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--top_k", type=int, default=2)
    p.add_argument("--C", type=int, default=512)
    p.add_argument("--F", type=int, default=1024)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="CPU threads for both libraries (0: their default)")
    p.add_argument("--no_torch", action="store_true")
    a = p.parse_args()
    import infinitrain as it
    if a.threads:
        it.set_num_threads(a.threads)
        if not a.no_torch:
            import torch
            torch.set_num_threads(a.threads)
    print(f"== grouped GEMM vs one product per expert: {a.tokens} tokens x top-{a.top_k}, C {a.C}, F {a.F}, "
          f"{a.dtype} on {a.device} ({it.get_num_threads()} threads), ms, best of {a.repeat} ==")
    rng = np.random.default_rng(0)
    for experts in a.experts:
        counts = routed_counts(a.tokens, a.top_k, experts, rng)
        times = ours(counts, a.C, a.F, a.dtype, a.device, a.repeat)
        if not a.no_torch:
            times.update(torchs(counts, a.C, a.F, a.dtype, a.device, a.repeat))
        print(f"{experts:3d} experts (rows per expert {min(counts)}..{max(counts)}): "
              + ", ".join(f"{k} {v:.2f}" for k, v in times.items()))


if __name__ == "__main__":
    main()
