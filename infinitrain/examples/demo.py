"""A tour of the native kernels: softmax regression trained with matmul, fused cross-entropy
and fused AdamW, with the gradients written out by hand (autograd arrives with the GPT-2
work). Prints the loss falling and the allocator's figures.

    python -m infinitrain.examples.demo [--steps 60] [--threads N] [--dtype float32|bfloat16]
"""
from __future__ import annotations

import argparse
import time

import infinitrain as it
from infinitrain.examples.flags import positive_float, positive_int
from infinitrain.kernels import neural as nn, optim


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=positive_int, default=60)
    p.add_argument("--batch_size", type=positive_int, default=512)
    p.add_argument("--features", type=positive_int, default=256)
    p.add_argument("--classes", type=positive_int, default=10)
    p.add_argument("--learning_rate", type=positive_float, default=0.05)
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--seed", type=int, default=42)
    a = p.parse_args(argv)
    if a.threads:
        it.set_num_threads(a.threads)
    print(it.build_info())
    it.manual_seed(a.seed)

    # A teacher: labels are the argmax of a fixed random linear map of the inputs.
    teacher = it.randn(a.features, a.classes)
    weight = it.zeros(a.features, a.classes)
    exp_avg, exp_avg_sq = it.zeros_like(weight), it.zeros_like(weight)
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        x = it.randn(a.batch_size, a.features)
        y = (x @ teacher).argmax(-1)
        xc, wc = x.to(a.dtype), weight.to(a.dtype)
        logits = xc @ wc
        losses, lse = nn.cross_entropy(logits, y)
        dlosses = it.full((a.batch_size,), 1.0 / a.batch_size)
        dlogits = nn.cross_entropy_backward(dlosses, logits, lse, y)
        grad = (xc.t() @ dlogits).float()
        optim.adamw_step(weight, grad, exp_avg, exp_avg_sq, lr=a.learning_rate, beta1=0.9,
                         beta2=0.95, eps=1e-8, weight_decay=0.0, step=step)
        accuracy = (logits.float().argmax(-1).numpy() == y.numpy()).mean()
        ms = (time.perf_counter() - t0) * 1e3
        if step == 1 or step % 10 == 0:
            print(f"step {step:4d}/{a.steps} | loss {losses.mean().item():.6f} | "
                  f"batch accuracy {accuracy:6.2%} | {ms:.2f} ms")
    stats = it.memory_stats()
    print(f"allocator: peak {stats['peak_allocated_bytes'] / 2**20:.1f} MiB in tensors, "
          f"{stats['num_cache_hits']}/{stats['num_allocs']} allocations served from the cache")


if __name__ == "__main__":
    main()
