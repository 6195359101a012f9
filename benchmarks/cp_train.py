"""Context parallelism measured, in one run:

1. memory and speed against the sequence length: LLaMA-3 trained through the example's front
   door at CP 1, 2 and 4, each CP > 1 with each attention communication (--cp_comm p2p: the
   ring; all_gather; a2a: DeepSpeed-Ulysses' all-to-all), on the same global batch (--batch
   sequences of T tokens per step), each a fresh `mpiexec` job: the median tokens/s over the
   steps after the first and rank 0's `peak used` (the native allocator's peak, weights,
   gradients and AdamW state included); then, in a job of this script's own, the activation
   memory: the most a forward + backward of the same batch holds above the model's own
   tensors, on the CP rank that holds most.
2. the balance of causal work over the CP ranks: ring attention forward + backward on one
   layer's worth of q/k/v, split head-tail (this project's default) and contiguous
   (picotron's), each rank's attention kernel time from the profiler and its block-product
   FLOPs. Head-tail gives every rank the same work; contiguous gives the last rank CP times
   the first's.

    python benchmarks/cp_train.py                           # LLaMA-3 small, T 256..1024
    python benchmarks/cp_train.py --seqs 1024 2048 4096 8192 --cp_comms p2p all_gather a2a a2a+p2p
    python benchmarks/cp_train.py --model tiny --seqs 128 256 --cps 1 2 --cp_comms p2p a2a

(The balance part runs itself under mpiexec: `python benchmarks/cp_train.py --balance`.)
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

from mpi_launch import start as launch



def _block_size(args) -> int:
    from infinitrain.models import LLAMA3_PRESETS
    return LLAMA3_PRESETS[args.model].block_size


def _comm_flags(args, cp: int, comm: str) -> list:
    """The example's CP flags; a2a+p2p's all-to-all groups --cp_a2a_size ranks wide (on one node
    the default would be every CP rank: a2a itself)."""
    flags = ["--cp_comm", comm]
    if comm == "a2a+p2p":
        if cp % args.cp_a2a_size or cp == args.cp_a2a_size:
            raise SystemExit(f"a2a+p2p at CP {cp} needs --cp_a2a_size dividing it and smaller (got {args.cp_a2a_size})")
        flags += ["--cp_a2a_size", str(args.cp_a2a_size)]
    return flags


def train_run(args, seq: int, cp: int, comm: str) -> tuple:
    tokens = args.batch * seq
    longer = ["--max_position_embeddings", str(seq)] if seq > _block_size(args) else []
    cmd = [*launch(cp), sys.executable, "-m", "infinitrain.examples.llama3", "--model", args.model, *longer,
           "--batch_size", str(args.batch), "--sequence_length", str(seq), "--total_batch_size", str(tokens),
           "--num_iteration", str(args.steps), "--context_parallel", str(cp), *_comm_flags(args, cp, comm),
           "--peak_tflops", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                         env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    rates = [float(x) for x in re.findall(r"\| (\d+) tok/s", out.stdout)][1:]
    peak = max(int(x) for x in re.findall(r"peak used:\s+(\d+) MB", out.stdout))
    return statistics.median(rates), peak


def under_mpiexec(args, n: int, *flags) -> str:
    out = subprocess.run([*launch(n), sys.executable, __file__, *flags], capture_output=True,
                         text=True, timeout=3600, env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
    if out.returncode:
        raise SystemExit(out.stdout[-2000:] + out.stderr[-2000:])
    return out.stdout


def activations(args) -> None:
    """Under mpiexec -n CP: prints the largest per-rank activation peak (bytes) of a forward and
    backward of --batch sequences of --seq tokens."""
    from dataclasses import replace

    import numpy as np
    import infinitrain as it
    from infinitrain.models import LLAMA3_PRESETS, LLaMA3
    from infinitrain.nn import parallel
    from mpi4py import MPI
    env = parallel.init(context_parallel=MPI.COMM_WORLD.Get_size())  # every rank in one CP group
    A = args.cp_a2a_size if args.cp_comm == "a2a+p2p" else None
    cp = parallel.ParallelPlan(env, cp_comm=args.cp_comm, cp_a2a_size=A).context_parallel()
    config = LLAMA3_PRESETS[args.model]
    model = LLaMA3(replace(config, block_size=max(config.block_size, args.seq)), cp=cp)
    data = np.random.default_rng(0).integers(0, 50257, (args.batch, args.seq + 1))
    idx, targets = it.from_numpy(data[:, :-1].copy()), it.from_numpy(data[:, 1:].copy())
    peak = 0
    for _ in range(2):  # the second pass: gradients already allocated, as in training
        model.zero_grad(set_to_none=False)
        start = it.memory_stats()["allocated_bytes"]
        it.reset_peak_memory_stats()
        model(idx, targets, return_logits=False)[1].backward()
        peak = it.memory_stats()["peak_allocated_bytes"] - start
    t = it.tensor([float(peak)], dtype=it.float64)
    env.world.all_reduce(t, parallel.ReduceOp.MAX)
    if env.rank == 0:
        print(f"activation_peak {int(t.item())}")


def memory_and_speed(args) -> None:
    print(f"LLaMA-3 {args.model}, {args.batch} sequences per step, fp32 AdamW, {args.threads} thread(s) per "
          f"rank, {os.cpu_count()} cores (CP ranks beyond the cores share them: compare memory, and "
          "speed only where CP <= cores)")
    print(f"{'T':>6} | {'CP':>3} | {'cp_comm':>10} | {'tok/s':>7} | {'peak MB/rank':>12} | "
          f"{'activations MB/rank':>19}")
    for seq in args.seqs:
        for cp in args.cps:
            for comm in (args.cp_comms if cp > 1 else ["-"]):
                if comm == "a2a+p2p" and cp <= args.cp_a2a_size:
                    continue  # (one all-to-all group: a2a itself)
                rate, peak = train_run(args, seq, cp, comm if cp > 1 else "p2p")
                out = under_mpiexec(args, cp, "--activations", "--model", args.model, "--batch", str(args.batch),
                                    "--seq", str(seq), "--cp_comm", comm if cp > 1 else "p2p",
                                    "--cp_a2a_size", str(args.cp_a2a_size))
                act = int(re.search(r"activation_peak (\d+)", out).group(1)) / 2**20
                print(f"{seq:6d} | {cp:3d} | {comm:>10} | {rate:7.0f} | {peak:12d} | {act:19.1f}", flush=True)


def balance(args) -> None:
    """Under mpiexec -n CP."""
    import numpy as np
    import infinitrain as it
    from infinitrain import profiler
    from infinitrain.nn import parallel
    from infinitrain.nn.parallel.context_parallel import ContextParallel
    env = parallel.init()
    P, rng = env.world_size, np.random.default_rng(0)
    B, H, Hkv, D, T = 1, 8, 4, 64, args.balance_seq
    full = [rng.standard_normal(s).astype(np.float32) for s in [(B, H, T, D), (B, Hkv, T, D), (B, Hkv, T, D)]]
    rows = []
    for balanced in (True, False):
        cp = ContextParallel(env.world, "p2p", balanced)
        q, k, v = (cp.shard(it.from_numpy(a), dim=2).requires_grad_() for a in full)
        cp.attention(q, k, v).sum().backward()  # warm-up
        with profiler.profile() as prof:
            for _ in range(args.repeat):
                cp.attention(q, k, v).sum().backward()
        ms = sum(r["total_ns"] for r in prof.key_averages()
                 if r["category"] == "kernel" and r["name"] in ("attention", "attention_backward")) / 1e6
        c = T // cp.n_chunks
        # block products this rank computes: a query chunk against each key chunk it sees, the
        # diagonal one causal (half); 4 (forward) + 8 (backward) FLOPs per pair per head dim
        pairs = sum((i + 0.5) * c * c for i in cp.chunks())
        gflop = pairs * 12 * B * H * D / 1e9
        t = it.tensor([ms, gflop], dtype=it.float64)
        gathered = it.empty(P, 2, dtype=it.float64)
        env.world.all_gather(gathered, t)
        rows.append((balanced, gathered.numpy() / [args.repeat, 1]))
    if env.rank == 0:
        print(f"ring attention fwd+bwd, T {T}, {H} heads ({Hkv} KV), head_dim {D}, CP {P}: per rank, "
              f"attention kernel ms per pass / block-product GFLOP")
        for balanced, r in rows:
            name = "head-tail" if balanced else "contiguous"
            cells = " | ".join(f"{ms:7.1f} ms {g:5.2f}" for ms, g in r)
            print(f"{name:>10} | {cells} | slowest / mean {r[:, 0].max() / r[:, 0].mean():.2f}, "
                  f"FLOP max / mean {r[:, 1].max() / r[:, 1].mean():.2f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small")
    p.add_argument("--batch", type=int, default=1, help="sequences per step (the global batch)")
    p.add_argument("--seqs", type=int, nargs="+", default=[256, 512, 1024])
    p.add_argument("--cps", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--cp_comms", nargs="+", default=["p2p", "all_gather", "a2a"],
                   choices=["p2p", "all_gather", "a2a", "a2a+p2p"])
    p.add_argument("--cp_a2a_size", type=int, default=2,
                   help="a2a+p2p: the all-to-all groups' size (the ring joins the groups)")
    p.add_argument("--cp_comm", default="p2p", help="(internal) with --activations")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads per rank")
    p.add_argument("--balance_seq", type=int, default=2048)
    p.add_argument("--balance_cps", type=int, nargs="*", default=[2, 4])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--balance", action="store_true", help="(internal) the balance part, under mpiexec")
    p.add_argument("--activations", action="store_true", help="(internal) the activation peak, under mpiexec")
    p.add_argument("--seq", type=int, default=256, help="(internal) with --activations")
    args = p.parse_args()
    if args.balance:
        return balance(args)
    if args.activations:
        return activations(args)
    memory_and_speed(args)
    for cp in args.balance_cps:
        print(under_mpiexec(args, cp, "--balance", "--balance_seq", str(args.balance_seq), "--repeat",
                            str(args.repeat)), end="", flush=True)


if __name__ == "__main__":
    main()
