"""What offloading AdamW's state to disk costs and saves, in one run:

1. the disk: `dd` writing and reading the size of the state with direct I/O (what the disk gives
   a plain sequential copy), against OffloadOptimizer streaming the same bytes through its
   blocks (read-ahead and write-behind), with direct and with buffered I/O, and how much page
   cache each leaves behind;
2. GPT-2 124M trained through the trainer's own step, one fresh process each, without offload,
   with --offload_optimizer nvme, and with ZeRO-3's parameters offloaded too (--zero_stage 3
   --offload_param nvme, on one process): step time, the process's peak RSS, the allocator's
   persistent bytes, the disk traffic per step and how long the optimizer waited for it.

On a GPU (--device cuda) it compares instead the GPU's own AdamW, the state in host memory with
the gradients copied to it at the step, and the same with the gradients streamed to it during
backward (ZeRO-Offload's schedule): step and optimizer time, the GPU's peak memory, how many
gradient bytes went to the host during backward, and whether the losses are the same bits.

    python benchmarks/offload.py --path /var/tmp            # 124M, 4 steps of 1 x 64 tokens
    python benchmarks/offload.py --path /var/tmp --layers 2 --skip_dd
    python benchmarks/offload.py --device cuda --batch 8 --seq 1024
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

MB = 2 ** 20


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", default=tempfile.gettempdir(), help="folder on the disk to offload to")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=4, help="timed steps (after one untimed)")
    p.add_argument("--skip_dd", action="store_true")
    p.add_argument("--device", default="cpu", help="cpu: offload to disk; cuda: offload from the GPU to host memory")
    p.add_argument("--job", default=None, help=argparse.SUPPRESS)  # one process of a row of JOBS
    return p.parse_args(argv)


def _cached() -> int:
    with open("/proc/meminfo") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("Cached:"))


def _dd(path: str, nbytes: int) -> tuple:
    """dd's own rate for a direct-I/O write and read of nbytes in 64 MB blocks (GB/s)."""
    name = os.path.join(path, "offload-bench-dd")
    count = max(1, nbytes // (64 * MB))
    rates = []
    try:
        for cmd in (["dd", "if=/dev/zero", f"of={name}", "bs=64M", f"count={count}", "oflag=direct"],
                    ["dd", f"if={name}", "of=/dev/null", "bs=64M", "iflag=direct"]):
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
            copied, seconds = re.search(r"^(\d+) bytes.* copied, ([\d.]+) s", out, re.M).groups()
            rates.append(int(copied) / float(seconds) / 1e9)
    finally:
        if os.path.exists(name):
            os.unlink(name)
    return tuple(rates)


def _stream(path: str, numel: int, direct: bool) -> tuple:
    """OffloadOptimizer's step over numel AdamW elements with zero gradients: (GB/s of reads
    plus writes over the step's wall time, MB of page cache it grew)."""
    import infinitrain as it
    from infinitrain.optim import AdamW, OffloadOptimizer
    p = it.nn.Parameter(it.zeros(numel))
    p.grad = it.zeros(numel)
    opt = OffloadOptimizer(AdamW([p], lr=1e-3), "nvme", path=path, direct=direct)
    opt.step()  # the first pass touches every block once
    before, t0 = _cached(), time.perf_counter()
    opt.step()
    seconds = time.perf_counter() - t0
    grown = _cached() - before
    moved = 2 * opt.state_bytes
    opt.close()
    return moved / seconds / 1e9, grown / MB, seconds


JOBS = {"cpu": ("none", "nvme", "nvme+param"), "cuda": ("none", "cpu at step", "cpu streamed")}


def _job(args) -> None:
    """One training process: prints a JSON line of its figures."""
    import resource

    import numpy as np

    import infinitrain as it
    from infinitrain.models import GPT2Config
    from infinitrain.models.gpt2 import GPT2
    from infinitrain.nn import parallel
    from infinitrain.nn.parallel.train_step import TrainStep, decay_groups
    from infinitrain.optim import AdamW

    env = parallel.init(device=args.device)
    gpu = env.device.type == "cuda"
    it.manual_seed(0)
    model = GPT2(GPT2Config(block_size=max(args.seq, 64), vocab_size=50257, n_layer=args.layers,
                            n_head=max(1, args.embd // 64), n_embd=args.embd)).to(env.device)
    offload = None if args.job == "none" else "cpu" if gpu else "nvme"
    param = "nvme" if args.job == "nvme+param" else None
    plan = parallel.ParallelPlan(env, zero_stage=3 if param else 0, offload_optimizer=offload,
                                 offload_path=args.path if offload == "nvme" else None, offload_param=param)
    trainer = TrainStep(model, plan, decay_groups(model, 0.1), AdamW, lr=1e-4)
    if args.job == "cpu at step":
        trainer.streaming = None  # the gradients are copied when the step runs
    rng = np.random.default_rng(0)
    batch = [(it.from_numpy(rng.integers(0, 50257, (args.batch, args.seq))).to(env.device),
              it.from_numpy(rng.integers(0, 50257, (args.batch, args.seq))).to(env.device))]

    def done():  # a GPU's work is queued, not done, when the host returns
        if gpu:
            it.cuda.synchronize(env.device)
        return time.perf_counter()

    losses = [trainer.step(batch)[0]]  # the first step creates the state
    persistent = it.memory_stats(env.device)["allocated_bytes"]
    it.reset_peak_memory_stats(env.device)
    store = trainer.offloaded.store if trainer.offloaded is not None else None
    moved0 = (store.bytes_read + store.bytes_written, store.waited) if store and not gpu else (0, 0.0)
    times, optimizer = [], []
    for _ in range(args.steps):
        t0 = done()
        losses.append(trainer.forward_backward(batch))
        t1 = done()
        trainer.optimizer_step()
        times.append(done() - t0)
        optimizer.append(time.perf_counter() - t1)
    moved = ((store.bytes_read + store.bytes_written - moved0[0]) / args.steps,
             (store.waited - moved0[1]) / args.steps) if store and not gpu else (0, 0.0)
    print(json.dumps(dict(step=float(np.median(times)), optimizer=float(np.median(optimizer)),
                          rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, persistent=persistent,
                          peak=it.memory_stats(env.device)["peak_allocated_bytes"],
                          streamed=trainer.offloaded.streamed_bytes if trainer.offloaded is not None else 0,
                          params=sum(p.numel() for p in model.parameters()), moved=moved[0], waited=moved[1],
                          losses=losses)), flush=True)


def main() -> None:
    args = _args()
    if args.job is not None:
        return _job(args)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(os.cpu_count())))
    rows = {}
    gpu = args.device.startswith("cuda")
    for kind in JOBS["cuda" if gpu else "cpu"]:
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--job", kind], capture_output=True,
                             text=True, timeout=3600, env=env)
        if out.returncode:
            raise SystemExit(f"{kind} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        rows[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    P = rows["none"]["params"]
    state = 8 * P
    same = all(r["losses"] == rows["none"]["losses"] for r in rows.values())
    if gpu:
        print(f"GPT-2 {args.layers} layers x {args.embd} on {args.device}: {P / 1e6:.1f}M parameters, "
              f"{args.batch} x {args.seq} tokens per step, host AdamW on {env['OMP_NUM_THREADS']} threads")
        print("AdamW state       | step ms | optimizer ms | GPU peak MB | GPU persistent MB | MB to host in backward")
        for kind, r in rows.items():
            where = "on the GPU" if kind == "none" else f"host, {kind.split(' ', 1)[1]}"
            print(f"{where:17s} | {r['step'] * 1e3:7.1f} | {r['optimizer'] * 1e3:12.1f} | {r['peak'] / MB:11.0f} | "
                  f"{r['persistent'] / MB:17.0f} | {r['streamed'] / MB:22.0f}")
        print(f"losses {'bit-identical' if same else 'DIFFER'}")
        return
    print(f"GPT-2 {args.layers} layers x {args.embd}: {P / 1e6:.1f}M parameters, AdamW state {state / MB:.0f} MB, "
          f"{args.batch} x {args.seq} tokens per step, {env['OMP_NUM_THREADS']} threads, offload to {args.path}")
    if not args.skip_dd:
        w, r = _dd(args.path, state)
        print(f"disk, dd with direct I/O, 64 MB blocks ({state / MB:.0f} MB): write {w:.2f} GB/s, read {r:.2f} GB/s")
        for direct in (True, False):
            rate, grown, seconds = _stream(args.path, P, direct)
            print(f"OffloadOptimizer step alone, {'direct' if direct else 'buffered'} I/O: {seconds:.2f} s for "
                  f"{2 * state / MB:.0f} MB read + written = {rate:.2f} GB/s; page cache grew {grown:.0f} MB")
    print("offload    | step ms | optimizer ms | peak RSS MB | persistent MB | disk MB/step | waited ms/step")
    for kind, r in rows.items():
        print(f"{kind:10s} | {r['step'] * 1e3:7.0f} | {r['optimizer'] * 1e3:12.0f} | {r['rss'] / MB:11.0f} | "
              f"{r['persistent'] / MB:13.0f} | {r['moved'] / MB:12.0f} | {r['waited'] * 1e3:14.0f}")
    print(f"peak RSS fell by {(rows['none']['rss'] - rows['nvme']['rss']) / MB:.0f} MB (the state is "
          f"{state / MB:.0f} MB, the two staging buffers 128 MB); losses {'bit-identical' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
