"""Pipeline schedules and layer splits compared on one job: GPipe, 1F1B, interleaved 1F1B and the
zero-bubble ZB-H1 and ZBV (backward split into B and a deferred W), each with the even and the
balanced split of the blocks (nn.parallel.pp.chunk_layers), training the
same GPT-2 on the same global batch. Per schedule: tokens/s (median over the steps after the first),
and per stage the measured bubble (the share of the step the stage sat blocked on a
neighbour), the peak tensor memory and the peak activation memory (what a step held above what
it started with). On paper (`simulate`, forward 1 : backward 2): the bubble of the split's
estimated work (each chunk's blocks, the head's blocks' worth on the last chunk, as the balanced
split counts them; a split backward's W is half of it). Then the step and each stage's bubble
on paper with each pass's measured cost (F, B and W of each chunk, its wall time less its waits):
the distance between that and the measured bubble is what the engine adds (messages, waits,
start-up), the rest is the split and the schedule. And the same with each pass's CPU time,
printed per stage as F/B/W milliseconds: on a machine other work loads, wall times are noise
but CPU times hardly move, so that column (tokens/s on paper with the CPU times) is the one to
compare there; `--interleave` runs the schedules in one job taking turns step by step, so that
the load falls on them alike.

    python benchmarks/pp_train.py                          # PP 4, 8 micro-batches, GPT-2 small
    python benchmarks/pp_train.py --pp 2 --micro 8 --layers 8 --seq 128
    python benchmarks/pp_train.py --schedules 1f1b zb-h1 zbv --splits balanced   # the zero-bubble table
    python benchmarks/pp_train.py --pp 2 --vocab 1024 --schedules 1f1b zb-h1 zbv --splits even --interleave \
        --steps 9                                          # ZB-H1's and ZBV's cost against 1F1B's
    python benchmarks/pp_train.py --pp 1 --vocab 1024 --schedules 1f1b zb-h1 --splits even --interleave \
        --steps 9                                          # one stage: the B/W split's cost alone

Each schedule is a fresh `mpiexec -n PP` job running this file with --child; with fewer cores
than ranks the stages share cores and the measured bubble mixes with that contention.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from mpi_launch import start


def _timed_pipeline(base):
    """PipelineParallel that times each pass: wall less the waits for its input (what the
    stage computed) and the process's CPU time (which another process on the core hardly
    changes: the figure to compare on a loaded machine), per (kind, local chunk)."""
    class Timed(base):
        def _run_pass(self, batches, kind, micro, chunk, context):
            wait, c0, t0 = self.waited(), time.process_time(), time.perf_counter()
            out = super()._run_pass(batches, kind, micro, chunk, context)
            row = self.pass_times.setdefault((kind, chunk), [0, 0.0, 0.0])
            row[0] += 1
            row[1] += time.perf_counter() - t0 - (self.waited() - wait)
            row[2] += time.process_time() - c0
            return out

        def waited(self) -> float:
            return self.p2p.wait_s if self.p2p is not None else 0.0  # one stage (--pp 1) waits for no one
    return Timed


def child(args) -> None:
    import infinitrain as it
    from infinitrain.models import gpt2
    from infinitrain.nn import parallel
    from infinitrain.nn.parallel.pp import PipelineParallel
    from infinitrain.optim import AdamW
    from mpi4py import MPI

    schedules = args.schedule.split(",")
    env = parallel.init(pipeline_parallel=args.pp)
    Timed = _timed_pipeline(PipelineParallel)
    jobs = []
    for name in schedules:  # one model per schedule (a V places the blocks otherwise), the same weights
        V = 2 if name in ("interleaved", "zbv") else 1
        plan = parallel.ParallelPlan(env, virtual_pipeline_parallel=V, pipeline_schedule=name,
                                     pipeline_split=args.split)
        sizes = {"vocab_size": args.vocab} if args.vocab else {}
        it.manual_seed(0)
        before = it.memory_stats()["allocated_bytes"]
        model = gpt2(args.model, pp=plan.pipeline_stage(), n_layer=args.layers, **sizes)
        pipe = Timed(model, name, deallocate_outputs=args.outputs[0] == "freed",
                     post_receives=args.receives[0] == "ahead")
        # what this schedule's model holds between steps: its weights here, gradients and the
        # optimizer's state after the first step (the peak counts these, not the other schedules')
        own = [it.memory_stats()["allocated_bytes"] - before]
        jobs.append((name, V, model, pipe, AdamW(model.parameters(), lr=1e-4), [], own))
    rng = __import__("numpy").random.default_rng(0)
    b = args.batch // args.micro
    for step in range(args.steps):
        data = rng.integers(0, jobs[0][2].config.vocab_size, (args.batch, args.seq + 1))
        micro = [(it.from_numpy(data[m * b:(m + 1) * b, :-1].copy()),
                  it.from_numpy(data[m * b:(m + 1) * b, 1:].copy())) for m in range(args.micro)]
        for name, V, model, pipe, opt, rows, own in jobs:  # the schedules take turns, step by step
            start_bytes = it.memory_stats()["allocated_bytes"]
            it.reset_peak_memory_stats()
            env.world.barrier()
            if pipe.p2p is not None:
                pipe.p2p.wait_s = 0.0
            pipe.pass_times = {}
            t0, c0 = time.perf_counter(), time.process_time()
            pipe.forward_backward(micro)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            peak = it.memory_stats()["peak_allocated_bytes"]
            opt.step()
            opt.zero_grad(set_to_none=False)
            if step == 0:
                own[0] += it.memory_stats()["allocated_bytes"] - start_bytes
            held = peak - start_bytes  # the step's activations and temporaries
            if len(jobs) > 1:  # the peak of this schedule's model alone
                peak = own[0] + held
            rows.append((elapsed, pipe.waited() / elapsed, peak, held, cpu, pipe.pass_times))
    load = os.getloadavg()[0]
    for name, V, model, pipe, opt, rows, _ in jobs:
        rows = rows[1:] or rows  # the first step allocates the gradients
        mine = (statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows),
                max(r[2] for r in rows), max(r[3] for r in rows), statistics.median(r[4] for r in rows),
                _per_pass(rows))
        every = MPI.COMM_WORLD.gather(mine, root=0)
        layers = MPI.COMM_WORLD.gather(model.stage_layers, root=0)
        if env.is_main:
            _report(args, name, V, every, layers, type(model).head_work(model.config), load)


def _per_pass(rows) -> dict:
    """(kind, local chunk) -> the median over the steps of (computing s, CPU s) per pass."""
    out = {}
    for key in rows[0][5]:
        n = rows[0][5][key][0]
        out[key] = tuple(statistics.median(r[5][key][i] / n for r in rows) for i in (1, 2))
    return out


def _report(args, name, V, every, layers, head_work, load) -> None:
    from infinitrain.nn.parallel.pp import simulate
    from infinitrain.nn.parallel.pp.schedules import placement
    from infinitrain.nn.parallel.pp.stage import global_chunk
    P, M = args.pp, args.micro
    where = placement(name)
    # the split's work on paper: each global chunk's blocks, the head's blocks' worth on the last
    est = [0.0] * (P * V)
    for s, chunks in enumerate(layers):
        for v, c in enumerate(chunks):
            est[global_chunk(s, v, P, where)] = len(c)
    est[-1] += head_work
    estimated = simulate(name, P, V, M, chunk_work=est)
    # on paper with each pass's measured cost: computing (wall less waits), then CPU time
    costs = [[{}] * (P * V) for _ in range(2)]
    for s, stage in enumerate(every):
        for v in range(V):
            g = global_chunk(s, v, P, where)
            for i in range(2):
                costs[i][g] = {k: stage[5].get((k, v), (0.0, 0.0))[i] for k in "FBW"}
    paper, cpu_paper = (simulate(name, P, V, M, pass_costs=c) for c in costs)
    step_s = max(r[0] for r in every)
    tokens = args.batch * args.seq
    blocks = [sum(map(len, c)) for c in layers]
    cpu = " | CPU ms per pass F/B/W " + ", ".join(
        "s%d %s" % (s, "+".join("/".join(f"{stage[5].get((k, v), (0, 0))[1] * 1e3:.1f}" for k in "FBW")
                                 for v in range(V))) for s, stage in enumerate(every))
    print(f"{name:>11} {args.split:>8} {args.outputs[0]:>5} {args.receives[0]:>9} {str(blocks):>8} | "
          f"{tokens / step_s:6.0f} tok/s, on paper with the CPU times {tokens / cpu_paper['time']:6.0f} | "
          f"{estimated['bubble']:4.0%} | step {step_s * 1e3:6.0f} ms, on paper {paper['time'] * 1e3:6.0f}, "
          f"CPU {cpu_paper['time'] * 1e3:6.0f} | " + ", ".join(
              f"s{s} bubble {w:4.0%} (paper {pb:4.0%}, CPU {cb:4.0%}) peak {p / 2**20:6.1f} MB act {a / 2**20:6.1f} MB"
              for s, ((_, w, p, a, *_), pb, cb) in enumerate(zip(every, paper["stage_bubbles"],
                                                                 cpu_paper["stage_bubbles"])))
          + cpu + f" | load {load:.1f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=0, help="vocabulary size (0: the preset's); a small one "
                   "makes the head light, so that the stages do equal work and the schedule alone sets the bubble")
    p.add_argument("--pp", type=int, default=4)
    p.add_argument("--micro", type=int, default=8, help="micro-batches per step")
    p.add_argument("--batch", type=int, default=16, help="global batch, sequences")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads per rank")
    p.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b", "interleaved", "zb-h1", "zbv"])
    p.add_argument("--splits", nargs="+", default=["even", "balanced"],
                   help="how blocks are split over the stages (nn.parallel.pp.chunk_layers)")
    p.add_argument("--outputs", nargs="+", default=["freed"], choices=["freed", "kept"],
                   help="a chunk's sent output: its memory given back once sent (the default), or kept "
                        "until its backward (to measure what freeing saves: --outputs kept freed)")
    p.add_argument("--receives", nargs="+", default=["ahead"], choices=["ahead", "on_demand"],
                   help="each pass posting the next pass's receive before it computes (the default), or "
                        "receives posted when needed (to compare: --receives on_demand ahead)")
    p.add_argument("--interleave", action="store_true",
                   help="run the schedules in one job, taking turns step by step, so that a loaded machine "
                        "slows them alike (each its own model, the same weights)")
    p.add_argument("--split", default="balanced", help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--schedule", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.batch % args.micro:
        raise SystemExit(f"--batch {args.batch} is not a multiple of --micro {args.micro}")
    if args.child:
        return child(args)
    vocab = f", vocabulary {args.vocab}" if args.vocab else ""
    print(f"GPT-2 {args.model} with {args.layers} layers{vocab}, PP {args.pp}, {args.micro} micro-batches of "
          f"{args.batch // args.micro} x {args.seq} tokens, fp32, {args.threads} thread(s) per rank, "
          f"{os.cpu_count()} cores")
    print(f"load average {os.getloadavg()[0]:.1f} (figures under load are noise, but for the CPU times)")
    print("   schedule    split outputs receives   blocks | throughput, and on paper with each pass's CPU time | "
          "bubble on paper, the split's estimated work | step measured, on paper with each pass's measured "
          "computing time, with its CPU time | per stage: measured bubble (on paper with the computing times, "
          "with the CPU times), peaks | CPU ms per pass (chunk by chunk) | load average at the end")
    together = [",".join(args.schedules)] if args.interleave else args.schedules
    runs = [(s, split, o, r) for s in together for split in args.splits for o in args.outputs
            for r in args.receives]
    for s, split, outputs, receives in runs:
        cmd = [*start(int(str(args.pp))), sys.executable, __file__,
               "--child", "--schedule", s, "--split", split, "--outputs", outputs, "--receives", receives] + [
                   f"--{k}={v}" for k, v in vars(args).items()
                   if k in ("model", "layers", "vocab", "pp", "micro", "batch", "seq", "steps")]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                             env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
        if out.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
        print(out.stdout.rstrip(), flush=True)


if __name__ == "__main__":
    main()
