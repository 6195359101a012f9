"""What the profiler costs: GPT-2 training steps timed with no profiler and inside one,
interleaved (this kind of machine's step times wander by 10-20%), medians printed, with the
events recorded per step.

    python benchmarks/profiler_overhead.py [--model small] [--batch 4] [--seq 128] [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import infinitrain as it
from infinitrain import profiler
from infinitrain.models.gpt2 import gpt2
from infinitrain.optim import AdamW


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    it.manual_seed(0)
    model = gpt2(args.model)
    opt = AdamW(model.parameters(), lr=1e-4)
    data = np.random.default_rng(0).integers(0, 50257, (args.batch, args.seq + 1))
    x, y = it.from_numpy(data[:, :-1].copy()), it.from_numpy(data[:, 1:].copy())

    def step():
        _, loss = model(x, y, return_logits=False)
        loss.backward()
        opt.step()
        opt.zero_grad()

    step()  # allocate
    off, on, events = [], [], 0
    for _ in range(args.repeats):
        t = time.perf_counter()
        step()
        off.append(time.perf_counter() - t)
        with profiler.profile() as prof:
            t = time.perf_counter()
            step()
            on.append(time.perf_counter() - t)
        events = len(prof.events)
    a, b = statistics.median(off) * 1e3, statistics.median(on) * 1e3
    print(f"GPT-2 {args.model}, {args.batch} x {args.seq} tokens, {it.get_num_threads()} thread(s): "
          f"{a:.1f} ms/step without a profiler, {b:.1f} ms/step profiled ({100 * (b - a) / a:+.1f}%), "
          f"{events} events per step")


if __name__ == "__main__":
    main()
