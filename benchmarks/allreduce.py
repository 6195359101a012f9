"""Collective bandwidth through infinitrain's ProcessGroup against raw mpi4py on the same
buffers (algbw and busbw, as nccl-tests report them, for all_reduce, all_gather, reduce_scatter
and broadcast), the per-call time of small collectives, and how much of DDP's all-reduce time is
hidden behind the backward pass.

    python benchmarks/allreduce.py          # starts itself on 2 ranks with the venv's mpiexec
    mpiexec -n 4 python benchmarks/allreduce.py
    python benchmarks/allreduce.py --latency   # only the small-message table

algbw = size / time, busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n (all_gather,
reduce_scatter) or 1 (broadcast); best of several runs. Overlap: how long DDP still
waits for its all-reduces when backward has finished (median over steps), against the time the
same all-reduces take run alone; hidden share = 1 - wait / alone; and the share the profiler's
trace shows (`communication_overlap`: the time bytes moved during which kernels ran, the least
over ranks). Prints figures; asserts nothing.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

from mpi_launch import start


def best(fn, repeat=10):
    fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def bandwidth(env):
    """Every collective in nccl-tests' terms, through the ProcessGroup and through raw mpi4py on
    the same memory: S is the collective's size (all_reduce and broadcast: the buffer; all_gather:
    the gathered output; reduce_scatter: the input), algbw = S / time, busbw = algbw x the
    factor that makes it comparable with the link's bandwidth (all_reduce 2(n-1)/n, all_gather
    and reduce_scatter (n-1)/n, broadcast 1)."""
    from mpi4py import MPI

    import infinitrain as it
    comm, n = env.comm, env.world_size
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
              "broadcast": 1.0}
    if env.is_main:
        print(f"== collectives (float32) on {n} ranks, nccl-tests' terms: GB/s, best of 10 ==")
        print(f"  {'collective':>14s} {'bytes':>10s} | {'algbw':>7s} {'busbw':>7s} | {'mpi4py algbw':>12s} "
              f"{'busbw':>7s} | {'ratio':>6s}")
    for name in factor:
        for nbytes in (256 << 10, 4 << 20, 64 << 20):
            k = nbytes // 4
            if name in ("all_gather", "reduce_scatter"):  # S is the whole: n pieces of k / n
                k -= k % n
                whole, piece = it.ones(k), it.ones(k // n)
                a_whole, a_piece = whole.numpy(), piece.numpy()
            else:
                buf = it.ones(k)
                arr = buf.numpy()
            ours, raw = {
                "all_reduce": (lambda: env.world.all_reduce(buf),
                               lambda: comm.Allreduce(MPI.IN_PLACE, arr, op=MPI.SUM)),
                "all_gather": (lambda: env.world.all_gather(whole, piece),
                               lambda: comm.Allgather(a_piece, a_whole)),
                "reduce_scatter": (lambda: env.world.reduce_scatter(piece, whole),
                                   lambda: comm.Reduce_scatter_block(a_whole, a_piece, op=MPI.SUM)),
                "broadcast": (lambda: env.world.broadcast(buf, 0), lambda: comm.Bcast(arr, root=0)),
            }[name]
            comm.Barrier()
            t_ours = comm.allreduce(best(ours), op=MPI.MAX)
            comm.Barrier()
            t_raw = comm.allreduce(best(raw), op=MPI.MAX)
            size = k * 4 / 1e9
            if env.is_main:
                print(f"  {name:>14s} {k * 4:10d} | {size / t_ours:7.2f} {size / t_ours * factor[name]:7.2f} | "
                      f"{size / t_raw:12.2f} {size / t_raw * factor[name]:7.2f} | {t_raw / t_ours:6.1%}")


def latency(env):
    """Per-call time of the small collectives tensor parallelism issues several times per layer
    (all-reduce, all-gather, reduce-scatter of 4 KB to 1 MB), median of many calls, against
    raw mpi4py on the same memory: the difference is the Python cost of the ProcessGroup."""
    from mpi4py import MPI

    import infinitrain as it
    comm, n = env.comm, env.world_size
    if env.is_main:
        print(f"== small collectives on {n} ranks: microseconds per call (median) ==")
        print(f"  {'bytes':>9s} | {'all_reduce':>10s} {'mpi4py':>7s} | {'all_gather':>10s} {'mpi4py':>7s} | "
              f"{'reduce_scatter':>14s} {'mpi4py':>7s}")

    def median_us(fn, calls):
        fn()
        comm.Barrier()
        out = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return comm.allreduce(sorted(out)[len(out) // 2], op=MPI.MAX) * 1e6

    for nbytes in (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20):
        calls = 400 if nbytes <= 64 << 10 else 100
        k = nbytes // 4
        t, big, part = it.ones(k), it.ones(k * n), it.ones(k)
        a, b, c = t.numpy(), big.numpy(), part.numpy()
        row = [median_us(lambda: env.world.all_reduce(t), calls),
               median_us(lambda: comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM), calls),
               median_us(lambda: env.world.all_gather(big, t), calls),
               median_us(lambda: comm.Allgather(a, b), calls),
               median_us(lambda: env.world.reduce_scatter(part, big), calls),
               median_us(lambda: comm.Reduce_scatter_block(b, c, op=MPI.SUM), calls)]
        if env.is_main:
            print(f"  {nbytes:9d} | {row[0]:10.1f} {row[1]:7.1f} | {row[2]:10.1f} {row[3]:7.1f} | "
                  f"{row[4]:14.1f} {row[5]:7.1f}")


def overlap(env, name, model, batch, loss_fn, steps=6):
    from mpi4py import MPI

    from infinitrain.nn import parallel
    ddp = parallel.DistributedDataParallel(model)

    def backward(sync: bool):
        model.zero_grad()
        if sync:
            loss = loss_fn(ddp(batch))
        else:
            with ddp.no_sync():
                loss = loss_fn(ddp(batch))
        env.comm.Barrier()
        t0 = time.perf_counter()
        loss.backward()
        return time.perf_counter() - t0

    t_local = min(backward(False) for _ in range(steps))
    t_ddp, waits = [], []
    for _ in range(steps):
        t_ddp.append(backward(True))
        waits.append(ddp.reducer.last_wait_s)
    t_ddp, t_wait = min(t_ddp), sorted(waits)[len(waits) // 2]
    from infinitrain import profiler
    with profiler.profile() as prof:  # the same steps, the share read from the trace
        for _ in range(steps):
            backward(True)
    traced = prof.communication_overlap()["share"] or 0.0
    flats = [b.flat_grad for b in ddp.reducer.buckets]

    def alone():
        for f in flats:
            env.dp_group.all_reduce(f, parallel.ReduceOp.AVG)
    env.comm.Barrier()
    t_alone = best(alone, steps)
    t_local, t_ddp, t_alone, t_wait = (env.comm.allreduce(v, op=MPI.MAX)
                                       for v in (t_local, t_ddp, t_alone, t_wait))
    traced = env.comm.allreduce(traced, op=MPI.MIN)
    if env.is_main:
        mb = sum(f.nbytes for f in flats) / 2**20
        thread = "on" if env.dp_group._comm_thread is not None else "off"
        print(f"== DDP overlap, {name}, {len(flats)} buckets, {mb:.0f} MB of gradients, "
              f"{env.world_size} ranks, communication thread {thread} ==")
        print(f"  backward alone {t_local * 1e3:.0f} ms | backward + DDP {t_ddp * 1e3:.0f} ms | "
              f"all-reduces alone {t_alone * 1e3:.0f} ms | still waiting after backward "
              f"{t_wait * 1e3:.0f} ms | hidden {1 - t_wait / t_alone:.0%} | hidden in the profiler's trace "
              f"{traced:.0%}")


def main() -> None:
    from mpi4py import MPI
    if MPI.COMM_WORLD.Get_size() == 1 and "INFINITRAIN_BENCH_CHILD" not in os.environ:
        env = dict(os.environ, INFINITRAIN_BENCH_CHILD="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        sys.exit(subprocess.run([*start(2), sys.executable, __file__, *sys.argv[1:]],
                                env=env).returncode)
    import numpy as np

    import infinitrain as it
    from infinitrain import nn
    from infinitrain.models import gpt2
    from infinitrain.nn import parallel
    env = parallel.init()
    latency(env)
    if "--latency" in sys.argv:
        return
    bandwidth(env)
    it.manual_seed(0)
    tokens = it.tensor(np.random.default_rng(env.rank).integers(0, 50257, (4, 128)))
    model = gpt2("small")
    overlap(env, "GPT-2 small (B4 T128; the tied embedding's gradient completes last)",
            _LossOf(model, tokens), None, lambda loss: loss)
    mlp = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(8)])
    overlap(env, "MLP 8 x Linear(1024, 1024), batch 512", mlp, it.randn(512, 1024),
            lambda y: (y * y).mean())


class _LossOf:
    """GPT-2 as a module whose output is its loss (for the overlap measurement)."""

    def __new__(cls, model, tokens):
        from infinitrain import nn

        class Wrapped(nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, _):
                return self.model(tokens, tokens, return_logits=False)[1]
        return Wrapped()


if __name__ == "__main__":
    main()
