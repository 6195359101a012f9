"""conv2d forward + backward (input, weight and bias gradients) through infinitrain's native
kernels against PyTorch's CPU convolution, on the same small-CNN layer shapes and thread count,
in one run. Best of several runs each; prints a table and asserts nothing.

    python benchmarks/conv_vs_torch.py
    python benchmarks/conv_vs_torch.py --threads 2 --repeat 20
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import infinitrain as it
from infinitrain.nn import functional as F

# (batch, in_channels, out_channels, height/width, kernel, stride, padding, groups): LeNet/ResNet-style layers
SHAPES = [(32, 3, 32, 32, 3, 1, 1, 1), (32, 32, 64, 16, 3, 1, 1, 1), (32, 64, 64, 8, 3, 2, 1, 1),
          (32, 64, 64, 16, 1, 1, 0, 1), (32, 64, 64, 16, 3, 1, 1, 64)]


def best(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def step(lib, F_, x, w, b, g, stride, padding, groups):
    def run():
        for t in (x, w, b):
            t.grad = None
        y = F_.conv2d(x, w, b, stride=stride, padding=padding, groups=groups)
        y.backward(g)
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="threads for both (default: infinitrain's)")
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    import torch
    threads = args.threads or it.get_num_threads()
    it.set_num_threads(threads)
    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    print(f"conv2d forward+backward, float32, {threads} threads, best of {args.repeat} (ms)")
    print(f"{'N,Cin->Cout,HxW,k,s,p,g':<34} {'infinitrain':>12} {'torch':>9} {'ratio':>7}")
    for n, cin, cout, hw, k, s, p, groups in SHAPES:
        arrays = [rng.standard_normal(shape).astype(np.float32) for shape in
                  ((n, cin, hw, hw), (cout, cin // groups, k, k), (cout,))]
        oh = (hw + 2 * p - k) // s + 1
        g = rng.standard_normal((n, cout, oh, oh)).astype(np.float32)
        ours = [it.tensor(a, requires_grad=True) for a in arrays]
        theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
        t_ours = best(step(it, F, *ours, it.tensor(g), s, p, groups), args.repeat)
        t_torch = best(step(torch, torch.nn.functional, *theirs, torch.tensor(g), s, p, groups), args.repeat)
        label = f"{n},{cin}->{cout},{hw}x{hw},k{k},s{s},p{p},g{groups}"
        print(f"{label:<34} {t_ours * 1e3:>12.2f} {t_torch * 1e3:>9.2f} {t_ours / t_torch:>6.2f}x")


if __name__ == "__main__":
    main()
