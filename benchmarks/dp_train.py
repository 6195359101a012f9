"""Data parallelism on the CPU: infinitrain over MPI against PyTorch's DDP and FSDP2 (`fully_shard`)
over gloo, the same GPT-2, data and AdamW, side by side. Prints tokens/s and the scaling efficiency
(DP N's tokens/s over N times one process's, at the same per-rank batch and threads):

    python benchmarks/dp_train.py                     # GPT-2 small, 1 x 1 and 2 x 1, 3 repeats
    python benchmarks/dp_train.py --quick             # one repeat, few steps (~3 min on 2 quiet cores)
    python benchmarks/dp_train.py --model 124M --batch 1 --seq 128 --ranks 4
    python benchmarks/dp_train.py --it_variants "--zero_stage 1" "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=ring"
    python benchmarks/dp_train.py --engines infinitrain --profile   # where the DP step's time goes
    python benchmarks/dp_train.py --overlap 160     # can an all-reduce hide behind computation here?

Every run is a fresh job started by mpi_launch (torchrun's variables over mpiexec; PyTorch runs
`init_process_group("gloo")` from them), ranks x threads 1 x 1, 2 x 1 and, with --ranks 4, 4 x 1
(oversubscribed where the machine has fewer cores). The engines alternate within every repeat
(the order rotates), so that drift in the machine's load hits them all; each run's figure is the
median of its steps after --warmup, the table's the median over repeats. infinitrain runs
`python -m infinitrain.examples.gpt2` (DDP through its TrainStep); each --it_variants string is
one more infinitrain row with those flags added (NAME=VALUE words set environment variables;
by default ZeRO-1, which also shards AdamW as FSDP2 does);
PyTorch runs benchmarks/torch_gpt2.py's model (unpadded vocabulary) with DDP, or fully_shard on
every block and the root, AdamW (lr 1e-4, betas 0.9/0.95, eps 1e-8, no decay: the example's) and
the example's Shakespeare batches (the same TokenLoader). One process's baseline is the engine
without a process group (PyTorch's serves DDP and FSDP2). Each step is timed from fetching the
batch to the loss, averaged over the ranks, on the host. --tuned_malloc runs PyTorch with
gpt2_train.py's tuned glibc malloc. --profile ends with one more infinitrain job at the largest
DP size under the example's --profile: its op table's head and how much of the communication
was hidden behind computation. Figures are only worth reading on a quiet machine: the load
average before and after is printed.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # gpt2_train, torch_gpt2; mpi_launch from a checkout (also when
# mpi_launch's worker runs this file, which puts nothing on the path)
from gpt2_train import TUNED_MALLOC  # noqa: E402
from mpi_launch import command, parse  # noqa: E402

MODELS = {"small": "small", "124M": "gpt2"}  # benchmark name -> infinitrain preset
ENGINES = ("infinitrain", "ddp", "fsdp2")
LABEL = {"infinitrain": "infinitrain MPI", "ddp": "PyTorch DDP gloo", "fsdp2": "PyTorch FSDP2 gloo"}
STEP = re.compile(r"step\s+(\d+)/\d+ \| train loss ([\d.naif]+) .*?\(([\d.]+) ms \|")


def torch_child(preset: str, B: int, T: int, steps: int, fsdp: bool) -> None:
    """One rank of the PyTorch job (the whole job when WORLD_SIZE is 1): prints its step lines as
    the example does, so that one parser reads both."""
    import torch
    import torch.distributed as dist

    from infinitrain.data.loader import TokenLoader
    from infinitrain.data.prepare import shakespeare_files
    from infinitrain.models import GPT2_PRESETS
    from torch_gpt2 import TorchGPT2

    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if world > 1:
        dist.init_process_group("gloo")
    c = GPT2_PRESETS[preset]
    torch.manual_seed(0)
    model = TorchGPT2(c.n_layer, c.n_head, c.n_embd, c.vocab_size, c.block_size, c.vocab_size)
    if world > 1 and fsdp:
        from torch.distributed.fsdp import fully_shard
        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
    elif world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    data = TokenLoader(str(shakespeare_files()["train"]), B, T, rank, world, c.vocab_size)
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        x, y = (torch.from_numpy(t.numpy()) for t in data.next_batch())
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mean = loss.detach()
        if world > 1:  # the loss the example logs: the mean over the ranks
            dist.all_reduce(mean)
            mean /= world
        value = mean.item()
        ms = (time.perf_counter() - t0) * 1e3
        if rank == 0:
            print(f"step {step:4d}/{steps} | train loss {value:.6f} | ({ms:.2f} ms |", flush=True)
    if world > 1:
        dist.destroy_process_group()


def overlap_child(mb: float) -> None:
    """One rank of --overlap: the all-reduce of `mb` MB of fp32 on its own (blocking, median of 3),
    then started asynchronously while this rank multiplies matrices, polled between products as
    DDP's gradient hooks poll; the part hidden is what the overlapped run saved against the two
    one after the other."""
    import infinitrain as it
    from infinitrain.nn import parallel

    group = parallel.init().world
    grads = it.ones(int(mb * 2**18))
    a = it.randn(384, 384)

    def blocking() -> float:
        group.barrier()
        t0 = time.perf_counter()
        group.all_reduce(grads)
        return time.perf_counter() - t0

    def compute(products: int, work=None) -> float:
        group.barrier()
        t0 = time.perf_counter()
        for _ in range(products):
            it.matmul(a, a)
            if work is not None:
                work.is_completed()
        if work is not None:
            work.wait()
        return time.perf_counter() - t0

    comm = statistics.median(blocking() for _ in range(3))
    per = compute(20) / 20
    products = max(1, int(2 * comm / per))  # twice the all-reduce's time in products
    alone = compute(products)
    group.barrier()
    both = compute(products, group.all_reduce(grads, async_op=True))
    if group.rank == 0:
        hidden = (alone + comm - both) / comm
        print(f"all-reduce of {mb:g} MB: {comm * 1e3:.0f} ms alone; started before {alone * 1e3:.0f} ms of matrix "
              f"products (polled after each of {products}): {both * 1e3:.0f} ms for both, so {100 * hidden:.0f}% of "
              f"the all-reduce was hidden", flush=True)


def label(engine: str) -> str:
    kind, flags, env = variant(engine)
    extra = " ".join([f"{k}={v}" for k, v in env.items()] + flags)
    return LABEL[kind] + (f" {extra}" if extra else "")


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def variant(engine: str) -> tuple:
    """An engine name ("infinitrain", "infinitrain FLAGS", "ddp", "fsdp2") -> (its kind, the
    example's extra flags, environment variables), from the words after "infinitrain"."""
    kind, _, extra = engine.partition(" ")
    words = shlex.split(extra)
    env = dict(w.split("=", 1) for w in words if re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", w))
    return kind, [w for w in words if w.split("=", 1)[0] not in env], env


def run(engine: str, ranks: int, a, profile: str | None = None) -> dict:
    """One fresh job: {tok_s, ms, losses, out}; tokens/s counts every rank's B x T."""
    launch = ["--nproc_per_node", str(ranks), "--rdzv_endpoint", f"127.0.0.1:{free_port()}"]
    steps = a.warmup + a.steps
    kind, flags, env = variant(engine)
    if kind == "infinitrain":
        program = ["-m", "infinitrain.examples.gpt2", "--model", MODELS[a.model], "--batch_size", str(a.batch),
                   "--sequence_length", str(a.seq), "--num_iteration", str(steps),
                   "--peak_tflops", "1", *flags]  # (a given peak skips measuring one)
        if profile:
            program += ["--profile", profile, "--profile_steps", str(min(a.steps, 2))]
    else:
        program = [__file__, "--child", kind, "--model", a.model, "--batch", str(a.batch), "--seq", str(a.seq),
                   "--steps", str(steps)]
        env = dict(env, **TUNED_MALLOC) if a.tuned_malloc else env
    cmd = command(parse(launch + program))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout,
                         env=dict(os.environ, OMP_NUM_THREADS=str(a.threads), **env))
    found = [m.groups() for m in STEP.finditer(out.stdout)]
    if out.returncode or len(found) != steps:
        raise SystemExit(f"{engine} on {ranks} rank(s) failed ({out.returncode}):\n{shlex.join(cmd)}\n"
                         f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    ms = statistics.median(float(t) for _, _, t in found[a.warmup:])
    return {"tok_s": ranks * a.batch * a.seq / ms * 1e3, "ms": ms, "losses": [float(v) for _, v, _ in found],
            "out": out.stdout}


def load() -> str:
    return "load average " + " ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small", choices=list(MODELS), help="small: 4 layers x 256; 124M: GPT-2")
    p.add_argument("--batch", type=int, default=None, help="sequences per rank (default 4, 124M 2)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default 256, 124M 128)")
    p.add_argument("--ranks", type=int, default=2, choices=[2, 4], help="largest DP size (4: also 4 x 1)")
    p.add_argument("--threads", type=int, default=1, help="threads per rank")
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=5, help="measured steps per run")
    p.add_argument("--warmup", type=int, default=2, help="steps per run before those measured")
    p.add_argument("--quick", action="store_true", help="1 repeat, 3 measured steps after 1, small batches")
    p.add_argument("--tuned_malloc", action="store_true", help="PyTorch with gpt2_train.py's tuned malloc")
    p.add_argument("--it_variants", nargs="*", default=["--zero_stage 1"], metavar="FLAGS",
                   help="more infinitrain rows, each the example with these flags (and NAME=VALUE variables); "
                        "default: ZeRO-1 (each rank's AdamW on its half: the optimizer step's share is large on "
                        "a CPU); give none to leave it out")
    p.add_argument("--profile", action="store_true", help="then profile infinitrain at the largest DP size")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    p.add_argument("--overlap", type=float, default=None, metavar="MB",
                   help="only probe whether an all-reduce of MB megabytes hides behind computation on these ranks "
                        "(without and with the communication thread); --ranks of them")
    p.add_argument("--child", choices=["ddp", "fsdp2", "overlap"], help=argparse.SUPPRESS)
    a = p.parse_args()
    big = a.model == "124M"
    if a.quick:
        a.repeats, a.steps, a.warmup = 1, 3, 1
    a.batch = a.batch or (1 if big and a.quick else 2 if big else 2 if a.quick else 4)
    a.seq = a.seq or (128 if big or a.quick else 256)
    for flag in ("batch", "seq", "threads", "repeats", "steps"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag} must be at least 1, got {getattr(a, flag)}")
    if a.warmup < 0:
        p.error(f"--warmup must be at least 0, got {a.warmup}")
    if a.child == "overlap":
        overlap_child(a.overlap)
        return
    if a.child:
        torch_child(MODELS[a.model], a.batch, a.seq, a.steps, a.child == "fsdp2")
        return
    if a.overlap is not None:
        for thread in ("0", "1"):
            print(f"{a.ranks} ranks x {a.threads} thread(s), communication thread {'on' if thread == '1' else 'off'} "
                  f"(INFINITRAIN_COMM_THREAD={thread}); {load()}", flush=True)
            cmd = command(parse(["--nproc_per_node", str(a.ranks), __file__, "--child", "overlap", "--overlap",
                                 str(a.overlap)]))
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=dict(
                os.environ, OMP_NUM_THREADS=str(a.threads), INFINITRAIN_COMM_THREAD=thread))
            print("".join(ln.split("] ", 1)[-1] + "\n" for ln in out.stdout.splitlines() if "all-reduce of" in ln)
                  or f"failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}", end="")
        return
    sizes = [1, 2] + ([4] if a.ranks == 4 else [])
    print(f"GPT-2 {a.model}, {a.batch} x {a.seq} tokens per rank, fp32 AdamW, {a.threads} thread(s) per rank, "
          f"{os.cpu_count()} cores; {a.repeats} repeat(s) of {a.warmup} + {a.steps} steps; {load()}", flush=True)
    if a.it_variants and "infinitrain" not in a.engines:
        p.error("--it_variants are columns beside infinitrain's: keep infinitrain in --engines")
    engines = [e for v in a.engines for e in [v] + (["infinitrain " + f for f in a.it_variants] if v == "infinitrain"
                                                     else [])]
    # one process's baseline: PyTorch's serves DDP and FSDP2
    jobs = [(n, e) for n in sizes for e in engines if n > 1 or e != "fsdp2" or "ddp" not in engines]
    results = {job: [] for job in jobs}
    for r in range(a.repeats):
        for n in sizes:
            mine = [e for e in engines if (n, e) in results]
            for e in mine[r % len(mine):] + mine[:r % len(mine)]:  # rotated each repeat
                results[(n, e)].append(run(e, n, a))
                print(f"  repeat {r + 1}: {n} x {a.threads} {label(e)}: {results[(n, e)][-1]['tok_s']:.0f} tok/s",
                      flush=True)
    tok = {job: statistics.median(x["tok_s"] for x in runs) for job, runs in results.items()}
    for e in engines:  # PyTorch's one process, under FSDP2's row too
        if (1, e) not in tok:
            tok[(1, e)] = tok[(1, "ddp")]
    cols = [f"{n} x {a.threads}" + (" over" if n * a.threads > (os.cpu_count() or 1) else "") for n in sizes]
    ours = [e for e in engines if variant(e)[0] == "infinitrain"]
    ratios = [(o, t, f"{label(o)} / {LABEL[t]}") for t in engines if variant(t)[0] != "infinitrain" for o in ours]
    width = max(len(name) for name in [label(e) for e in engines] + [r[2] for r in ratios])
    print(f"\n{'tokens/s (scaling efficiency)':{width}s}" + "".join(f" | {c:>15s}" for c in cols))
    for e in engines:
        print(f"{label(e):{width}s}" + "".join(
            f" | {tok[(n, e)]:8.0f} ({100 * tok[(n, e)] / (n * tok[(1, e)]):3.0f}%)" for n in sizes))
    for o, t, name in ratios:
        print(f"{name:{width}s}" + "".join(f" | {tok[(n, o)] / tok[(n, t)]:14.2f}x" for n in sizes))
    print(f"efficiency: tokens/s over N x one process's (same engine, per-rank batch and threads); 'over': more "
          f"ranks x threads than the {os.cpu_count()} cores; {load()}", flush=True)
    if a.profile:
        path = str(Path(os.environ.get("TMPDIR", "/tmp")) / f"dp_train_{os.getpid()}.json")
        lines = run("infinitrain", sizes[-1], a, profile=path)["out"].splitlines()
        at = next((i for i, ln in enumerate(lines) if "---- profile of steps" in ln), len(lines))
        comm = re.compile(r"(^|\] )(wait|all_reduce) |communication:")
        table = lines[at:at + 14] + [ln for ln in lines[at:] if comm.search(ln)]
        print(f"\ninfinitrain at DP {sizes[-1]} under --profile (rank 0, the op table's head; every rank's trace: "
              f"{path})")
        print("\n".join(dict.fromkeys(table)) or "(no profile in the output)")

if __name__ == "__main__":
    main()
