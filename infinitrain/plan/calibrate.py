"""`python -m infinitrain.plan calibrate`: this machine's rates, measured through the engine's
own ops, written as a profile (profile.py). Run it on the ranks a job would use (mpiexec -n N
python -m infinitrain.plan calibrate --output FILE): every rank measures its compute at once,
so that ranks sharing cores see what they will get while training, and the collectives are
timed over all N ranks with mpi4py. On one process the collectives keep the profile's
defaults (or --base's figures), and it says so.

    matmul:      it.matmul at the products a block makes ([B T, C] x [C, 4C] and the like)
    attention:   nn.functional.scaled_dot_product_attention, causal, forward
    bandwidth:   an elementwise add of 64 MB operands (three operands' bytes moved)
    optimizer:   AdamW's step over 4M fp32 parameters
    collectives: all_reduce, all_gather, reduce_scatter, all_to_all, send_recv at 4 KB - 8 MB,
                 the median of a few, fitted to alpha + beta bytes per ring step (profile.py)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from ..nn.parallel.global_env import share_node_cores
from .profile import COLLECTIVES, DEFAULT, Profile, fit_alpha_beta

SIZES = [2 ** k for k in range(12, 24, 2)]  # 4 KB .. 8 MB per collective
# (tokens, width) of the blocks measured: the tiny presets' to GPT-2 124M's, short and long micro-batches
SHAPES = [(128, 64), (128, 256), (512, 256), (256, 768), (1024, 768)]


def _timed(fn, comm=None, least_seconds: float = 0.2) -> float:
    """Seconds per call of fn while every rank of comm runs it too: the same number of calls on
    every rank, started together, over at least least_seconds. (The fastest single call, timed
    while the other ranks were between theirs, had a core to itself: on this project's 2-core
    machine it put two ranks' matrix products at twice what they reach together.)"""
    fn()  # warm up
    t = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t, 1e-9)
    calls = max(3, int(least_seconds / once))
    if comm is not None and comm.Get_size() > 1:
        calls = comm.allreduce(calls, op=_min_op())
        comm.Barrier()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls


def _min_op():
    from mpi4py import MPI
    return MPI.MIN


def measure_compute(comm=None) -> dict:
    import infinitrain as it
    from infinitrain.nn import functional as F
    from infinitrain.optim import AdamW
    rng = np.random.default_rng(0)

    def randn(*shape):
        return it.from_numpy(rng.standard_normal(shape, dtype=np.float32))
    matmul, attention = [], []
    for tokens, C in SHAPES:
        for k, n in ((C, 3 * C), (C, 4 * C), (4 * C, C), (C, 50304)):  # the last: a head
            a, b = randn(tokens, k), randn(k, n)
            matmul.append([2 * tokens * k * n, 2 * tokens * k * n / _timed(lambda: it.matmul(a, b), comm)])
        H = C // 64
        for B, T in ((1, tokens), (max(1, tokens // 128), 128)):
            q, kk, v = (randn(B, H, T, 64) for _ in range(3))
            flops = 2 * B * H * T * T * 64
            t = _timed(lambda: F.scaled_dot_product_attention(q, kk, v, is_causal=True), comm)
            attention.append([flops, flops / t])
    x, y = randn(16 * 2 ** 20), randn(16 * 2 ** 20)
    bandwidth = 3 * x.numel() * 4 / _timed(lambda: it.add(x, y), comm)
    p = it.nn.Parameter(randn(4 * 2 ** 20))
    p.grad = randn(4 * 2 ** 20)
    opt = AdamW([p], lr=1e-4)
    optimizer = p.numel() / _timed(opt.step, comm)
    return {"matmul": matmul, "attention": attention, "memory_bandwidth": bandwidth, "optimizer": optimizer}


def measure_collectives(comm, repeats: int = 5) -> dict:
    """alpha and beta of each collective over the communicator's ranks (rank 0's times)."""
    from mpi4py import MPI
    n, rank = comm.Get_size(), comm.Get_rank()
    out = {}
    for name in COLLECTIVES:
        times = []
        for size in SIZES:
            count = size // 4 // n * n
            send, recv = np.ones(count, np.float32), np.empty(count, np.float32)
            part = np.empty(count // n, np.float32)
            peer = rank ^ 1 if (rank ^ 1) < n else rank

            def run():
                if name == "all_reduce":
                    comm.Allreduce(send, recv, MPI.SUM)
                elif name == "all_gather":
                    comm.Allgather(send[:count // n], recv)
                elif name == "reduce_scatter":
                    comm.Reduce_scatter_block(send, part, MPI.SUM)
                elif name == "all_to_all":
                    comm.Alltoall(send, recv)
                else:
                    comm.Sendrecv(send, peer, 0, recv, peer, 0)
            run()
            samples = []
            for _ in range(repeats):
                comm.Barrier()
                t = time.perf_counter()
                run()
                samples.append(comm.allreduce(time.perf_counter() - t, op=MPI.MAX))
            times.append(statistics.median(samples))
        out[name] = fit_alpha_beta(name, n if name != "send_recv" else 2, [s // 4 // n * n * 4 for s in SIZES], times)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m infinitrain.plan calibrate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", default="profile.json", help="the profile to write (JSON)")
    p.add_argument("--name", default=None, help="the machine's name in the profile")
    p.add_argument("--base", default=None, help="a profile whose figures this one starts from (the inter-node link, "
                                               "the overlap shares, collectives on one process)")
    p.add_argument("--repeats", type=int, default=5, help="timings of each collective per size (their median)")
    args = p.parse_args(argv)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    base = Profile.load(args.base).data if args.base else dict(DEFAULT)
    # the threads a training job's rank gets (init()'s share of the node's cores), so that ranks
    # measuring at once do not oversubscribe the cores: the rates are per those cores
    cores = share_node_cores(comm)
    compute = measure_compute(comm)
    compute["cores"] = cores
    links = measure_collectives(comm, args.repeats) if comm.Get_size() > 1 else None
    if comm.Get_rank() != 0:
        return 0
    import platform
    data = {**base, **compute, "name": args.name or f"{platform.node()} ({comm.Get_size()} ranks)", "device": "cpu",
            "measured_ranks": comm.Get_size()}
    if links is not None:
        data["intra_node"] = links
        data.setdefault("inter_node", links)
    Profile(data).save(args.output)
    rates = ", ".join(f"{f / 1e9:.1f}" for _, f in sorted(compute["matmul"]))
    print(f"wrote {args.output}: matmul {rates} GFLOP/s by size; bandwidth {compute['memory_bandwidth'] / 1e9:.1f} "
          f"GB/s; AdamW {compute['optimizer'] / 1e6:.0f}M parameters/s; measured with {compute['cores']:g} cores per "
          "rank")
    if links is None:
        print("one process: the collectives keep the base profile's figures (run under mpiexec -n N to measure "
              "them)", file=sys.stderr)
    else:
        print("collectives over", comm.Get_size(), "ranks: " + "; ".join(
            f"{k} alpha {v['alpha'] * 1e6:.1f} us, {1 / v['beta'] / 1e9 if v['beta'] else float('inf'):.2f} GB/s"
            for k, v in links.items()))
    return 0
