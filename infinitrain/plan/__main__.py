"""python -m infinitrain.plan: which layout for this model, batch and cluster.

    python -m infinitrain.plan --model gpt2 --global_batch 16 --sequence_length 1024 \\
        --nodes 4 --cores_per_node 64 --memory_per_node 256 --profile profile.json
    python -m infinitrain.plan --model small ... --explain dp=2,tp=2,sp=1,pp=1,cp=1,zero=1,recompute=none,mb=2
    python -m infinitrain.plan calibrate --output profile.json     (under mpiexec -n N for the collectives)
    python -m infinitrain.plan overlap --profile profile.json dp=dp_trace.json   (the overlap a --profile run measured)

Every layout the examples accept is listed (--top of them), those that fit first, by predicted
step time, with its memory per rank and step time by component and the command that runs it;
--explain shows one layout's arithmetic. Without --profile the rates are placeholders (say so
in anything quoted): calibrate first. docs/planning.md says how far the figures are trusted.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import Cluster, Profile, enumerate_candidates, parse, predict, refusal
from .layouts import RECOMPUTE, model_of
from .profile import DEFAULT_GPU, SHIPPED

GB = 2 ** 30


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m infinitrain.plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2",
                   help="a preset of the examples (gpt2, small, llama3.2-1b, ...), an llm.c checkpoint (GPT-2 or "
                        "LLaMA-3) or a Hugging Face transformers folder (its config.json is read, not its weights)")
    p.add_argument("--example", default=None, choices=["gpt2", "llama3"],
                   help="the example that trains it (default: the first whose presets have --model; small and "
                        "tiny are GPT-2's unless --example llama3)")
    p.add_argument("--config", default=None, help="a model configuration as JSON (the config class's fields)")
    p.add_argument("--global_batch", type=int, required=True, help="sequences per optimizer step")
    p.add_argument("--sequence_length", type=int, required=True)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--cores_per_node", type=int, default=None, help="a CPU cluster: the cores of a node")
    p.add_argument("--gpus_per_node", type=int, default=None, help="a GPU cluster: one rank per GPU")
    p.add_argument("--ranks_per_node", type=int, nargs="+", default=None,
                   help="CPU: the ranks per node to try (default: every divisor of --cores_per_node)")
    p.add_argument("--memory_per_node", type=float, required=True, help="GB a node's ranks may use")
    p.add_argument("--profile", default=None,
                   help="the machine's profile: a file (calibrate writes one) or a shipped one by name "
                        f"({', '.join(SHIPPED)})")
    p.add_argument("--zero_stages", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--recompute", nargs="+", default=list(RECOMPUTE), choices=list(RECOMPUTE))
    p.add_argument("--cp_comm", nargs="+", default=["p2p"], choices=["p2p", "all_gather", "a2a"])
    p.add_argument("--micro_batches", type=int, nargs="+", default=None,
                   help="sequences per micro-batch to try (default: every divisor of the batch per DP rank)")
    p.add_argument("--top", type=int, default=15, help="layouts listed")
    p.add_argument("--explain", default=None, metavar="LAYOUT",
                   help="one layout's arithmetic (its name as listed: dp=2,tp=1,pp=1,cp=1,zero=1,...)")
    p.add_argument("--simulate", type=int, nargs="+", default=None, metavar="NODES",
                   help="the best fitting layout at each of these node counts (TP within a node, CP up to 8), its "
                        "step and tokens/s, and the scaling efficiency against the first: a sketch, see "
                        "docs/planning.md")
    p.add_argument("--weak_scaling", action="store_true",
                   help="with --simulate: the global batch grows with the nodes (else it stays --global_batch)")
    args = p.parse_args(argv)
    if (args.cores_per_node is None) == (args.gpus_per_node is None):
        p.error("give the cluster's --cores_per_node (CPUs) or --gpus_per_node (GPUs)")
    for flag in ("global_batch", "sequence_length", "nodes", "top"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} must be a positive integer, got {getattr(args, flag)}")
    if args.memory_per_node <= 0:
        p.error(f"--memory_per_node must be positive GB, got {args.memory_per_node}")
    return args


def clusters(args) -> list:
    if args.gpus_per_node is not None:
        return [Cluster(args.nodes, args.gpus_per_node, args.gpus_per_node, args.memory_per_node * GB, "cuda")]
    per_node = args.ranks_per_node or [d for d in range(1, args.cores_per_node + 1) if args.cores_per_node % d == 0]
    return [Cluster(args.nodes, r, args.cores_per_node, args.memory_per_node * GB) for r in per_node]


def model_flag(model: str) -> str:
    """The examples' flag that names the model: a preset, an llm.c checkpoint or a transformers folder."""
    if not Path(model).exists():
        return f"--model {model}"
    return f"--{'from_pretrained' if Path(model).is_dir() else 'llmc_filepath'} {model}"


def command(c, cluster, example: str, model: str, global_batch: int, seq_len: int) -> str:
    launch = f"mpiexec -n {cluster.world_size}" + (f" -ppn {cluster.ranks_per_node}" if cluster.nodes > 1 else "")
    flags = " ".join(c.flags(global_batch, seq_len))
    return f"{launch} python -m infinitrain.examples.{example} {model_flag(model)} {flags}"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["calibrate"]:
        from .calibrate import main as calibrate
        return calibrate(argv[1:])
    if argv[:1] == ["overlap"]:
        from .overlap import main as overlap
        return overlap(argv[1:])
    args = _args(argv)
    try:
        config, cls, example = model_of(args.model, args.config, args.example)
        profile = Profile.load(args.profile) if args.profile else \
            Profile(DEFAULT_GPU if args.gpus_per_node else {}, "placeholders")
    except ValueError as e:
        sys.exit(str(e))
    G, T = args.global_batch, args.sequence_length
    where = args.profile or "no profile: placeholder rates, run calibrate"
    rated = profile.data.get("dtype", "float32")
    if rated != args.dtype:
        where += f" (its rates are {rated}'s, the job's products {args.dtype}: read the times with that in mind)"
    print(f"{cls.__name__} {args.config or args.model}: {G} x {T} tokens per step, {args.dtype}; rates from {where}")
    if args.explain:
        return explain(args, config, cls, example, profile)
    if args.simulate:
        return simulate_scales(args, config, cls, profile)
    rows, refused = [], {}
    for cluster in clusters(args):
        kept, why = enumerate_candidates(cluster.world_size, config, cls, G, T, zero_stages=args.zero_stages,
                                         recompute=args.recompute, cp_comms=args.cp_comm,
                                         micro_batches=args.micro_batches)
        for k, v in why.items():
            refused[k] = refused.get(k, 0) + v
        rows += [(predict(c, config, cls, cluster, profile, G, T, args.dtype), cluster) for c in kept]
    rows.sort(key=lambda r: (not r[0].fits, r[0].step_time))
    fitting = sum(p.fits for p, _ in rows)
    print(f"{len(rows)} layouts the examples accept ({fitting} fit in {args.memory_per_node:g} GB per node), "
          f"{sum(refused.values())} refused; the best {min(args.top, len(rows))}:")
    print(f"{'#':>3} {'layout':<58} {'ranks':>6} {'step ms':>9} {'compute':>8} {'bubble':>7} {'comm':>7} {'optim':>6} "
          f"{'MB/rank':>8} {'fits':>4}")
    for i, (pred, cluster) in enumerate(rows[:args.top], 1):
        t = pred.time
        comm = sum(v for k, v in t.items() if k.endswith("communication"))
        ranks = f"{cluster.nodes}x{cluster.ranks_per_node}"
        print(f"{i:>3} {pred.candidate.name:<58} {ranks:>6} {pred.step_time * 1e3:9.1f} {t['compute'] * 1e3:8.1f} "
              f"{t.get('pipeline bubble', 0) * 1e3:7.1f} {comm * 1e3:7.1f} {t['optimizer'] * 1e3:6.1f} "
              f"{pred.memory_per_rank / 2**20:8.0f} {'yes' if pred.fits else 'NO':>4}")
        print(f"    {command(pred.candidate, cluster, example, args.model, G, T)}")
    if refused:
        print("refused by the engine's checks (count, the first reason of each kind):")
        for reason, n in sorted(refused.items(), key=lambda kv: -kv[1])[:6]:
            print(f"  {n:5d}  {reason}")
    return 0


def simulate_scales(args, config, cls, profile) -> int:
    """--simulate: the planner at each node count, its best fitting layout and the scaling."""
    first = None
    print(f"{'nodes':>6} {'ranks':>6} {'batch':>6} {'step ms':>10} {'tokens/s':>12} {'per rank':>9} "
          f"{'efficiency':>10}  layout")
    for nodes in args.simulate:
        G = args.global_batch * nodes // args.simulate[0] if args.weak_scaling else args.global_batch
        best = None
        for cluster in clusters(argparse.Namespace(**{**vars(args), "nodes": nodes})):
            kept, _ = enumerate_candidates(cluster.world_size, config, cls, G, args.sequence_length,
                                           zero_stages=args.zero_stages, recompute=args.recompute,
                                           cp_comms=args.cp_comm, micro_batches=args.micro_batches,
                                           max_tp=cluster.ranks_per_node, max_cp=8)
            for c in kept:
                pred = predict(c, config, cls, cluster, profile, G, args.sequence_length, args.dtype)
                if pred.fits and (best is None or pred.step_time < best[0].step_time):
                    best = (pred, cluster)
        if best is None:
            print(f"{nodes:>6} no layout fits")
            continue
        pred, cluster = best
        rate = G * args.sequence_length / pred.step_time
        per_rank = rate / cluster.world_size
        first = first or per_rank
        print(f"{nodes:>6} {cluster.world_size:>6} {G:>6} {pred.step_time * 1e3:10.1f} {rate:12.0f} {per_rank:9.0f} "
              f"{per_rank / first:10.0%}  {pred.candidate.name}")
    return 0


def explain(args, config, cls, example, profile) -> int:
    try:
        c = parse(args.explain)
    except ValueError as e:
        sys.exit(str(e))
    options = [cl for cl in clusters(args) if cl.world_size == c.world_size]
    if not options:
        sys.exit(f"--explain {args.explain}: {c.world_size} ranks is no number of ranks this cluster runs "
                 f"({', '.join(str(cl.world_size) for cl in clusters(args))})")
    why = refusal(c, config, cls, args.global_batch, args.sequence_length)
    if why:
        sys.exit(f"--explain {args.explain}: the examples refuse this layout: {why}")
    cluster = options[0]
    pred = predict(c, config, cls, cluster, profile, args.global_batch, args.sequence_length, args.dtype)
    print(f"{c.name} on {cluster.nodes} node(s) x {cluster.ranks_per_node} ranks "
          f"({cluster.cores_per_rank:g} cores per rank)")
    for line in pred.lines:
        print("  " + line)
    print(f"  run: {command(c, cluster, example, args.model, args.global_batch, args.sequence_length)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
