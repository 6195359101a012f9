"""All-reduce bandwidth through infinitrain's ProcessGroup against raw mpi4py on the same
buffers, and how much of DDP's all-reduce time is hidden behind the backward pass.

    python benchmarks/allreduce.py          # starts itself on 2 ranks with the venv's mpiexec
    mpiexec -n 4 python benchmarks/allreduce.py

Bus bandwidth = 2 (n-1)/n * bytes / time, best of several runs. Overlap: the time backward +
DDP waits beyond a backward without communication, against the time the same all-reduces take
when run alone; hidden share = 1 - extra / alone. Prints figures; asserts nothing.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def best(fn, repeat=10):
    fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def bandwidth(env):
    import numpy as np
    from mpi4py import MPI

    import infinitrain as it
    comm, n = env.comm, env.world_size
    if env.is_main:
        print(f"== all-reduce (sum, float32) on {n} ranks: bus bandwidth GB/s ==")
        print(f"  {'bytes':>12s} {'ProcessGroup':>13s} {'mpi4py':>9s} {'ratio':>7s}")
    for nbytes in (4 << 10, 256 << 10, 4 << 20, 64 << 20):
        t = it.ones(nbytes // 4)
        arr = t.numpy()  # the same memory for both

        def ours():
            env.world.all_reduce(t)

        def raw():
            comm.Allreduce(MPI.IN_PLACE, arr, op=MPI.SUM)
        comm.Barrier()
        t_ours = comm.allreduce(best(ours), op=MPI.MAX)
        comm.Barrier()
        t_raw = comm.allreduce(best(raw), op=MPI.MAX)
        bus = 2 * (n - 1) / n * nbytes / 1e9
        if env.is_main:
            print(f"  {nbytes:12d} {bus / t_ours:13.2f} {bus / t_raw:9.2f} {t_raw / t_ours:6.1%}")


def overlap(env, steps=4):
    from mpi4py import MPI

    import infinitrain as it
    from infinitrain.models import gpt2
    from infinitrain.nn import parallel
    it.manual_seed(0)
    model = gpt2("small")
    ddp = parallel.DistributedDataParallel(model)
    x = it.tensor(__import__("numpy").random.default_rng(env.rank).integers(0, 50257, (4, 128)))

    def backward(sync: bool):
        model.zero_grad()
        if sync:
            _, loss = ddp(x, x, return_logits=False)
        else:
            with ddp.no_sync():
                _, loss = ddp(x, x, return_logits=False)
        env.comm.Barrier()
        t0 = time.perf_counter()
        loss.backward()
        return time.perf_counter() - t0

    t_local = min(backward(False) for _ in range(steps))
    t_ddp = min(backward(True) for _ in range(steps))
    flats = [b.flat for b in ddp.reducer.buckets]

    def alone():
        for f in flats:
            env.dp_group.all_reduce(f, parallel.ReduceOp.AVG)
    env.comm.Barrier()
    t_alone = best(alone, steps)
    t_local, t_ddp, t_alone = (env.comm.allreduce(v, op=MPI.MAX) for v in (t_local, t_ddp, t_alone))
    if env.is_main:
        extra = max(0.0, t_ddp - t_local)
        mb = sum(f.nbytes for f in flats) / 2**20
        print(f"== DDP overlap, GPT-2 small (B4 T128), {len(flats)} buckets, {mb:.0f} MB of gradients, "
              f"{env.world_size} ranks ==")
        print(f"  backward alone {t_local * 1e3:.0f} ms | backward + DDP {t_ddp * 1e3:.0f} ms | "
              f"all-reduces alone {t_alone * 1e3:.0f} ms | hidden {1 - extra / t_alone:.0%}")


def main() -> None:
    from mpi4py import MPI
    if MPI.COMM_WORLD.Get_size() == 1 and "INFINITRAIN_BENCH_CHILD" not in os.environ:
        mpiexec = str(Path(sys.executable).parent / "mpiexec")
        env = dict(os.environ, INFINITRAIN_BENCH_CHILD="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        sys.exit(subprocess.run([mpiexec, "-n", "2", sys.executable, __file__], env=env).returncode)
    from infinitrain.nn import parallel
    env = parallel.init()
    bandwidth(env)
    overlap(env)


if __name__ == "__main__":
    main()
