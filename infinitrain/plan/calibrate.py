"""`python -m infinitrain.plan calibrate`: this machine's rates, measured through the engine's
own ops, written as a profile (profile.py). Run it on as many ranks as the jobs to plan will
put on a node, the cores or more (mpiexec -n 8 python -m infinitrain.plan calibrate --output
FILE on a 2-core node): one rank per core measures its compute at once with the others, one
thread each (the tables); one rank alone with each thread count a rank of a job would run
(threads: the BLAS's threads do not add up to cores); every rank at once where there are more
ranks than cores (shared_cores: the node's throughput when ranks take turns); the collectives
over one rank per core, with the share of their time the rank's core was busy
(communication_cpu). Ranks not measuring wait asleep, not in a spinning MPI barrier. On one
process the collectives keep the profile's defaults (or --base's figures), and it says so.

    matmul:          nn.functional.linear at the products a block makes ([B T, C] x [C, 4C] and
                     the like) and a head's; matmul_backward: the same linear's backward
    attention:       nn.functional.scaled_dot_product_attention, causal, forward
    bandwidth:       an elementwise add of 64 MB operands (three operands' bytes moved)
    optimizer:       AdamW's step over 4M fp32 parameters
    loss:            nn.functional.cross_entropy's forward and backward over a head's logits
    collectives:     all_reduce, all_gather, reduce_scatter, all_to_all, send_recv at 4 KB - 8 MB,
                     the median of a few, fitted to alpha + beta bytes per ring step (profile.py);
                     synchronization: what a 1 MB all-reduce between block-sized products costs
                     beyond that (the skew between computing ranks)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from .profile import COLLECTIVES, DEFAULT, Profile, collective_time, fit_alpha_beta

SIZES = [2 ** k for k in range(12, 24, 2)]  # 4 KB .. 8 MB per collective
# (tokens, width) of the blocks measured: the tiny presets' to GPT-2 124M's, short and long micro-batches
SHAPES = [(128, 64), (128, 256), (256, 256), (512, 256), (1024, 256), (256, 768), (1024, 768)]
# (tokens, width) of the heads measured, at every micro-batch's tokens: the head's [C, vocab] product is
# not monotone in its tokens here (backward at C 256: 53, 69, 57 GFLOP/s at 128, 256, 512 tokens),
# so a rate read between two measured token counts can miss by 20%
HEAD_SHAPES = [(128, 64), (128, 256), (256, 256), (512, 256), (1024, 256), (128, 768), (256, 768), (512, 768),
               (1024, 768)]


def _timed(fn, comm=None, least_seconds: float = 0.2) -> float:
    """Seconds per call of fn while every rank of comm runs it too: the same number of calls on
    every rank, started together, over at least least_seconds. (The fastest single call, timed
    while the other ranks were between theirs, had a core to itself: on this project's 2-core
    machine it put two ranks' matrix products at twice what they reach together.)"""
    t = time.perf_counter()
    fn()  # warm up, and how long one call takes (a head-sized product takes seconds on one core)
    once = max(time.perf_counter() - t, 1e-9)
    # three calls at least: one call of a head-sized product, timed alone, wandered by 25% here
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


def measure_compute(comm=None, full: bool = True) -> dict:
    """The rates of this rank's threads, timed while every rank of comm runs them (full: every
    table, else the block's products alone: what shared_cores compares)."""
    import infinitrain as it
    from infinitrain.nn import functional as F
    from infinitrain.optim import AdamW
    rng = np.random.default_rng(0)

    def randn(*shape, grad=False):
        t = it.from_numpy(rng.standard_normal(shape, dtype=np.float32))
        return t.requires_grad_() if grad else t
    # the blocks' products and the head's apart: at equal FLOPs the head's skinny [C, vocab]
    # product runs at another rate, and a table by FLOPs alone would blend the two
    tables = {k: [] for k in ("matmul", "matmul_backward", "matmul_head", "matmul_backward_head")}
    attention = []
    products = [(tokens, k, n) for tokens, C in (SHAPES if full else SHAPES[-2:-1])
                for k, n in ((C, 3 * C), (C, 4 * C), (4 * C, C))[:None if full else 2]]
    for tokens, k, n in products + ([(tokens, C, 50304) for tokens, C in HEAD_SHAPES] if full else []):
        x, w, dy = randn(tokens, k, grad=True), randn(n, k, grad=True), randn(tokens, n)
        flops = 2 * tokens * k * n
        which = "_head" if n == 50304 else ""
        fwd = _timed(lambda: F.linear(x, w), comm)
        tables["matmul" + which].append([flops, flops / fwd])
        if full:
            both = _timed(lambda: F.linear(x, w).backward(dy), comm)
            tables["matmul_backward" + which].append([flops, 2 * flops / max(both - fwd, 1e-9)])
    for tokens, C in SHAPES if full else ():
        H = C // 64
        for B, T in ((1, tokens), (max(1, tokens // 128), 128)):
            q, kk, v = (randn(B, H, T, 64) for _ in range(3))
            flops = 2 * B * H * T * T * 64
            t = _timed(lambda: F.scaled_dot_product_attention(q, kk, v, is_causal=True), comm)
            attention.append([flops, flops / t])
    if not full:
        return {"matmul": tables["matmul"]}
    x, y = randn(16 * 2 ** 20), randn(16 * 2 ** 20)
    bandwidth = 3 * x.numel() * 4 / _timed(lambda: it.add(x, y), comm)
    p = it.nn.Parameter(randn(4 * 2 ** 20))
    p.grad = randn(4 * 2 ** 20)
    opt = AdamW([p], lr=1e-4)
    optimizer = p.numel() / _timed(opt.step, comm)
    logits = randn(SHAPES[-1][0], 50304, grad=True)
    targets = it.from_numpy(rng.integers(0, 50304, SHAPES[-1][0]).astype(np.int64))
    loss = logits.numel() / _timed(lambda: F.cross_entropy(logits, targets).backward(), comm)
    loss_parallel = _vocab_parallel_loss(randn, comm)
    return {**tables, "attention": attention, "memory_bandwidth": bandwidth, "optimizer": optimizer, "loss": loss,
            "loss_parallel": loss_parallel}


def _vocab_parallel_loss(randn, comm) -> float:
    """Logits per second through TP's vocabulary-parallel cross-entropy, forward and backward:
    one rank's half of the vocabulary at TP 2, with the padded columns the last rank holds, on a
    group of this rank alone (its three numbers per row cross no one). It runs as separate
    elementwise passes, not the fused kernel of F.cross_entropy: about three times its time."""
    from mpi4py import MPI

    from ..nn.parallel import MPIProcessGroup
    from ..nn.parallel.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
    from ..nn.parallel.tensor_parallel.shard import TensorParallel
    import infinitrain as it
    tokens, columns = SHAPES[-1][0], 50304 // 2
    vocab = columns - (50304 - 50257)  # GPT-2's padded columns, all on the last rank's half
    tp = TensorParallel(MPIProcessGroup(MPI.COMM_SELF, [comm.Get_rank() if comm is not None else 0]))
    logits = randn(tokens, columns, grad=True)
    targets = it.from_numpy(np.random.default_rng(1).integers(0, vocab, tokens).astype(np.int64))
    return logits.numel() / _timed(lambda: vocab_parallel_cross_entropy(logits, targets, vocab, tp).backward(), comm)


def _among(comm, ranks: int, fn):
    """fn(the communicator of ranks 0..ranks-1) on those ranks, the others asleep until they are
    done (an MPI barrier spins on its core); fn's result on rank 0's side, None elsewhere."""
    active = comm.Get_rank() < ranks
    sub = comm.Split(0 if active else 1, comm.Get_rank())
    out = fn(sub) if active else None
    sub.Free()
    done = comm.Ibarrier()
    pause = 0.001
    while not done.Test():
        # long naps: a rank waking every 2 ms took the cores from the ranks measuring (their
        # products 10-20% slower, an OpenMP team of two threads up to 2x)
        time.sleep(pause)
        pause = min(2 * pause, 0.05)
    return out


def measure_node(comm, cores: int) -> dict:
    """What the job's threads and ranks get (profile.py): the tables on one rank per core with one
    thread each; one rank alone with each thread count a job's rank would run (a divisor of the
    cores); where comm has more ranks than cores, every multiple of the cores at once."""
    from ..runtime import get_num_threads, set_num_threads
    n = comm.Get_size()
    per_core = min(n, cores)
    set_num_threads(max(1, cores // per_core))
    out = _among(comm, per_core, measure_compute)
    if out is not None:
        out["cores"] = get_num_threads()
    threads = {}
    for t in range(get_num_threads() + 1, cores + 1):
        if cores % t == 0:
            set_num_threads(t)
            rates = _among(comm, 1, lambda sub: measure_compute(None))
            if rates is not None:
                threads[str(t)] = rates
    set_num_threads(1)
    shared = [[1, 1.0]]
    base = comm.bcast(_among(comm, cores, lambda sub: _products(sub)) if n > cores else None)
    for k in range(2, n // cores + 1):
        if n >= k * cores and (k & (k - 1)) == 0:
            rate = _among(comm, k * cores, lambda sub: _products(sub))
            if rate is not None:
                shared.append([k, rate / base])
    # a pipeline stage waiting for its neighbour beside the busy ones: one per core, asleep in
    # the engine's own wait
    beside = _among(comm, 2 * cores, lambda sub: _products(sub, computing=cores)) if n >= 2 * cores else None
    if comm.Get_rank() != 0:
        return {}
    if beside is not None:
        out["pipeline_wait_cpu"] = round(_waiting_share(beside / base, shared), 3)
    if threads:
        out["threads"] = threads
    if len(shared) > 1:
        out["shared_cores"] = shared
    return out


def _products(comm, least_seconds: float = 0.5, computing: int | None = None) -> float:
    """The node's FLOP/s of a block's product with every rank of comm running it at once: all the
    ranks' FLOPs over the span from the first start to the last end (each rank's own rate would
    count the time it ran while others were still waiting to start as shared). computing: only
    that many ranks compute; each other rank waits for a message from one of them as a pipeline
    stage waits for its neighbour (pp/p2p.py's sleep_until), which they send when done."""
    import infinitrain as it
    from infinitrain.nn import functional as F

    from ..nn.parallel.pp.p2p import sleep_until
    tokens, C = SHAPES[-2] if len(SHAPES) > 2 else SHAPES[-1]
    rng = np.random.default_rng(0)
    x, w = (it.from_numpy(rng.standard_normal(s, dtype=np.float32)) for s in ((tokens, C), (4 * C, C)))
    once = _timed(lambda: F.linear(x, w), None, least_seconds=0.05)
    calls = comm.allreduce(max(3, int(least_seconds / once)), op=_min_op())
    rank, computing = comm.Get_rank(), computing or comm.Get_size()
    token = np.zeros(1, np.int8)
    comm.Barrier()
    span = None
    if rank < computing:
        start = time.monotonic()  # one clock for the node's processes
        for _ in range(calls):
            F.linear(x, w)
        span = (start, time.monotonic())
        for peer in range(rank + computing, comm.Get_size(), computing):
            comm.Send(token, peer)
    else:
        request = comm.Irecv(token, rank % computing)
        sleep_until(lambda: request.Test())
    spans = [s for s in comm.allgather(span) if s]
    return computing * calls * 2 * tokens * C * 4 * C / (max(e for _, e in spans) - min(s for s, _ in spans))


def _waiting_share(throughput: float, shared: list) -> float:
    """The share of a core a sleeping wait takes, as the cost model counts it (profile.py): with
    one busy rank and one waiting rank per core the busy ranks run at 1 / slowdown(1 + share) of
    their rate alone, slowdown(k) = k / the node's throughput at k ranks per core."""
    from .profile import _linear
    low, high = 0.0, 1.0
    for _ in range(40):
        mid = (low + high) / 2
        if _linear(shared, 1 + mid) / (1 + mid) > throughput:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def measure_collectives(comm, repeats: int = 5) -> dict:
    """(alpha and beta of each collective over the communicator's ranks, the slowest rank's times;
    the share of their time the ranks' cores were busy)."""
    from mpi4py import MPI
    n, rank = comm.Get_size(), comm.Get_rank()
    out, wall, cpu = {}, 0.0, 0.0
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
                t, c = time.perf_counter(), time.process_time()
                run()
                cpu += time.process_time() - c
                wall += time.perf_counter() - t
                samples.append(comm.allreduce(time.perf_counter() - t, op=MPI.MAX))
            times.append(statistics.median(samples))
        out[name] = fit_alpha_beta(name, n if name != "send_recv" else 2, [s // 4 // n * n * 4 for s in SIZES], times)
    # the share of a collective's time its rank's core was busy (copying, reducing, polling)
    busy = comm.allreduce(min(1.0, cpu / wall) if wall else 0.0) / n
    return out, round(busy, 3), measure_synchronization(comm, out["all_reduce"])


def measure_synchronization(comm, link: dict, calls: int = 60) -> float:
    """Seconds a blocking collective costs beyond its alpha-beta time when the ranks compute
    between calls, as a training step does: the skew between them (the slowest rank of each
    call sets its end). A block-sized product and a 1 MB all-reduce in turn, against the
    products alone, both with every rank running."""
    import infinitrain as it
    from infinitrain.nn import functional as F
    from mpi4py import MPI
    tokens, C = 512, 256  # a block's product of GPT-2 small at four sequences
    rng = np.random.default_rng(0)
    x, w = (it.from_numpy(rng.standard_normal(s, dtype=np.float32)) for s in ((tokens, C), (4 * C, C)))
    send, recv = np.ones(2 ** 18, np.float32), np.empty(2 ** 18, np.float32)

    def loop(talk: bool) -> float:
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(calls):
            F.linear(x, w)
            if talk:
                comm.Allreduce(send, recv, MPI.SUM)
        return comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
    loop(True)
    extra = (loop(True) - loop(False)) / calls - collective_time(link, "all_reduce", comm.Get_size(), send.nbytes)
    return max(0.0, extra)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m infinitrain.plan calibrate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", default="profile.json", help="the profile to write (JSON)")
    p.add_argument("--name", default=None, help="the machine's name in the profile")
    p.add_argument("--base", default=None, help="a profile whose figures this one starts from (the inter-node link, "
                                               "the overlap shares, collectives on one process)")
    p.add_argument("--repeats", type=int, default=5, help="timings of each collective per size (their median)")
    p.add_argument("--passes", type=int, default=3, help="measure the compute this many times and keep each "
                                                           "figure's median (default 3)")
    p.add_argument("--quick", action="store_true", help="the small shapes only (no 768-wide blocks or GPT-2 124M's "
                                                      "head): a check that it runs, not a profile to plan with")
    args = p.parse_args(argv)
    if args.passes < 1:
        p.error(f"--passes must be 1 or more, got {args.passes}")
    if args.quick:
        global SHAPES, HEAD_SHAPES
        SHAPES, HEAD_SHAPES = SHAPES[:2], HEAD_SHAPES[:2]
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    base = Profile.load(args.base).data if args.base else dict(DEFAULT)
    # one rank per core, one thread each, for the tables; the rest of what a job's ranks get on
    # this node (threads, ranks sharing cores) beside them: measure_node
    cores = _node_cores(comm)
    # each figure the median of the passes': one pass's single timings wander by 20% on a shared
    # (virtual) machine, the median of three by a few percent
    compute = _median([measure_node(comm, cores) for _ in range(args.passes)])
    links = _among(comm, min(cores, comm.Get_size()), lambda sub: measure_collectives(sub, args.repeats)
                   if sub.Get_size() > 1 else None) if comm.Get_size() > 1 else None
    # the wait for the slowest rank again where ranks take turns on the cores: a rank that is not
    # running when its peers reach a collective keeps them waiting (with 4 ranks to a core, for
    # most of a scheduler's time slice)
    link = comm.bcast(links[0]["all_reduce"] if links is not None else None)
    shared_sync = []
    for k in (2, 4):
        if link is not None and comm.Get_size() >= k * cores:
            s = _among(comm, k * cores, lambda sub: measure_synchronization(sub, link))
            shared_sync.append([k, s])
    if comm.Get_rank() != 0:
        return 0
    busy = sync = None
    if links is not None:
        links, busy, sync = links
    import platform
    data = {**base, **compute, "name": args.name or f"{platform.node()} ({comm.Get_size()} ranks)", "device": "cpu",
            "measured_ranks": comm.Get_size()}
    if links is not None:
        data["intra_node"] = links
        data.setdefault("inter_node", links)
        data["communication_cpu"] = busy
        data["synchronization"] = sync
        if shared_sync:
            data["synchronization_shared"] = [[1, sync]] + shared_sync
    Profile(data).save(args.output)
    rates = ", ".join(f"{f / 1e9:.1f}" for _, f in sorted(compute["matmul"]))
    print(f"wrote {args.output}: matmul {rates} GFLOP/s by size; bandwidth {compute['memory_bandwidth'] / 1e9:.1f} "
          f"GB/s; AdamW {compute['optimizer'] / 1e6:.0f}M parameters/s; measured with "
          f"{compute['cores']:g} thread(s) per rank, one rank per core of {cores}")
    for t, rates in compute.get("threads", {}).items():
        print(f"one rank with {t} threads: products x {_mean(rates['matmul']) / _mean(compute['matmul']):.2f} "
              f"one thread's (by size: " + ", ".join(f"{r / f:.2f}" for (_, r), (_, f) in
                                                  zip(rates["matmul"], compute["matmul"])) + ")")
    if "pipeline_wait_cpu" in compute:
        print(f"a pipeline stage asleep in its wait beside each busy rank takes {compute['pipeline_wait_cpu']:.0%} "
              "of a core")
    if "shared_cores" in compute:
        print("the node's products with k ranks per core, relative to one: " + ", ".join(
            f"k={k:g}: {v:.2f}" for k, v in compute["shared_cores"]))
    if links is None:
        print("one process: the collectives keep the base profile's figures (run under mpiexec -n N to measure "
              "them)", file=sys.stderr)
    else:
        print("collectives over", min(cores, comm.Get_size()), "ranks (one per core): " + "; ".join(
            f"{k} alpha {v['alpha'] * 1e6:.1f} us, {1 / v['beta'] / 1e9 if v['beta'] else float('inf'):.2f} GB/s"
            for k, v in links.items()) + f"; the ranks' cores busy {busy:.0%} of a collective's time; a blocking "
            f"call between computations waits {sync * 1e3:.2f} ms more for the slowest rank" + "".join(
                f", {s * 1e3:.2f} ms at {k} ranks per core" for k, s in shared_sync))
    return 0


def _median(passes: list):
    """Passes of the same measurement merged figure by figure: the median of each number, and of
    each row's rate in a [size, rate] table (the rows in the same order in every pass)."""
    first = passes[0]
    if isinstance(first, dict):
        return {k: _median([p[k] for p in passes]) for k in first}
    if isinstance(first, list):
        return [[row[0], statistics.median(p[i][1] for p in passes)] for i, row in enumerate(first)]
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return statistics.median(passes)
    return first


def _mean(rows) -> float:
    return len(rows) / sum(1 / r for _, r in rows)


def _node_cores(comm) -> int:
    """This node's cores: the set its ranks may run on, together."""
    from mpi4py import MPI
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = len(set().union(*map(set, local.allgather(mine))))
    local.Free()
    return cores
