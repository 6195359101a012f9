"""Causal attention forward and backward, infinitrain's kernels beside PyTorch's SDPA backends on
the same GPU: milliseconds per call (median, device synchronised around each) and TFLOP/s
(forward 2 products, backward 5, causal counted as half the square). Shapes: GPT-2 124M's
(B 16, 12 heads, T 1024, d 64) and a LLaMA-3-8B-like one (32 query / 8 kv heads, d 128).

    python benchmarks/attention.py                          # bf16 on cuda, both shapes
    python benchmarks/attention.py --shape 16 12 12 1024 64 --repeat 50
    python benchmarks/attention.py --kernels wmma mma mma-dkv32 reference --repeat 3

infinitrain runs its tensor-core flash kernels for 16-bit inputs with head size 64 or 128, each
family of --kernels in turn (INFINITRAIN_CUDA_ATTENTION: wmma, the default; mma, the register-
tiled mma.sync kernels, with mma-dkv32 their dK/dV pass on query tiles of 32; reference, the row
kernels); PyTorch (if installed with CUDA) runs cuDNN's, FlashAttention-2's and the memory-
efficient backends. Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

SHAPES = [(16, 12, 12, 1024, 64), (4, 32, 8, 2048, 128)]  # B, H, KV heads, T, d


def median_ms(fn, sync, repeat):
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return 1e3 * sorted(times)[len(times) // 2]


def flops(B, H, T, D):
    return 2 * B * H * T * T * D  # two T x T x D products, half of them under the causal mask


def ours(shape, dtype, repeat):
    import infinitrain as it
    from infinitrain.kernels import neural as knn
    B, H, KV, T, D = shape
    rng = np.random.default_rng(0)
    q, k, v, g = (it.from_numpy(rng.standard_normal((B, h, T, D)).astype(np.float32)).to(dtype).to("cuda")
                  for h in (H, KV, KV, H))
    fwd = median_ms(lambda: knn.attention(q, k, v, causal=True), it.cuda.synchronize, repeat)
    o, lse = knn.attention(q, k, v, causal=True)
    bwd = median_ms(lambda: knn.attention_backward(g, q, k, v, o, lse, causal=True), it.cuda.synchronize, repeat)
    return fwd, bwd


def torch_backends(shape, dtype, repeat):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    B, H, KV, T, D = shape
    dt = getattr(torch, dtype)
    q, k, v = (torch.randn(B, h, T, D, device="cuda", dtype=dt, requires_grad=True) for h in (H, KV, KV))
    g = torch.randn(B, H, T, D, device="cuda", dtype=dt)
    out = {}
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel(backend):
                def fwd():
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                            enable_gqa=KV != H)
                f = median_ms(fwd, torch.cuda.synchronize, repeat)
                fb = median_ms(lambda: torch.autograd.grad(fwd(), (q, k, v), g), torch.cuda.synchronize, repeat)
            out[backend.name.lower()] = (f, fb - f)
        except RuntimeError as e:  # a backend that does not take this shape or card
            print(f"  (PyTorch {backend.name}: {str(e).splitlines()[0][:100]})")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=int, nargs=5, action="append", metavar=("B", "H", "KV", "T", "D"))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--kernels", nargs="+", default=["wmma", "mma"],
                    choices=["wmma", "mma", "mma-dkv32", "reference"], help="infinitrain's kernel families to time")
    args = ap.parse_args()
    import infinitrain as it
    if not it.cuda.is_available():
        raise SystemExit("benchmarks/attention.py: no CUDA device here (the CPU's attention is timed by "
                         "benchmarks/gpt2_train.py's steps)")
    print(f"{'shape':28s} {'implementation':24s} {'fwd ms':>8s} {'TFLOP/s':>8s} {'bwd ms':>8s} {'TFLOP/s':>8s}")
    for shape in args.shape or SHAPES:
        B, H, KV, T, D = shape
        rows = []
        for kernels in args.kernels:  # the library reads both variables at every call
            os.environ["INFINITRAIN_CUDA_ATTENTION"] = kernels.split("-")[0]
            os.environ["INFINITRAIN_FLASH_DKV_TILE"] = "32" if kernels == "mma-dkv32" else "64"
            rows.append((f"infinitrain ({kernels})", ours(shape, args.dtype, args.repeat)))
        try:
            import torch
            if torch.cuda.is_available():
                rows += [(f"torch {name}", r) for name, r in torch_backends(shape, args.dtype, args.repeat).items()]
        except ImportError:
            pass
        label = f"B{B} H{H}/{KV} T{T} d{D}"
        for name, (f, b) in rows:
            print(f"{label:28s} {name:24s} {f:8.3f} {flops(B, H, T, D) / f / 1e9:8.1f} "
                  f"{b:8.3f} {2.5 * flops(B, H, T, D) / b / 1e9:8.1f}", flush=True)


if __name__ == "__main__":
    main()
