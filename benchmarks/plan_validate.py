"""The planner (infinitrain.plan) against measured runs: each configuration trains a few steps
through the examples on this machine, and its predicted peak memory per rank and step time are
printed beside what the examples report (peak used: the allocator's peak of the busiest rank,
which the process's own ~350 MB is not part of, so the prediction it is held to leaves out the
memory plan's "process"; the step: the median of the steps after the first), with the errors.
The issue's bar: memory within 10% and step time within 15% for 90% of the configurations.

    mpiexec -n 8 python -m infinitrain.plan calibrate --output profile.json     # this machine's rates
        # (8: the most ranks a configuration puts on the node, so that calibrate measures the
        # node's throughput with ranks taking turns on its cores; on an idle machine)
    python benchmarks/plan_validate.py --profile profile.json                   # every configuration
    python benchmarks/plan_validate.py --profile profile.json --only pp= --steps 6
    python benchmarks/plan_validate.py --memory_only --steps 2 --only llama3      # no profile, memory only
    python benchmarks/plan_validate.py --profile profile.json --save measured.json  # also keep what was measured
    python benchmarks/plan_validate.py --profile profile.json --measured benchmarks/plan_measured.json
        # predictions only, held to a saved table of measured runs (plan_measured.json: the runs
        # the docs' table comes from, each configuration's passes and their mean)
    python benchmarks/plan_validate.py --profile profile.json --choice gpt2,small,8,128,2
        # the planner's first choice for one job against the best of its layouts measured:
        # its --choice_top best by prediction and --choice_spread more spread over the ranking

Step times need an idle machine: ranks sharing cores with other work run at whatever is left.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mpi_launch import find_mpiexec, start  # noqa: E402

# (example, model, global batch, sequence length, layout): GPT-2 and LLaMA-3 from tiny to 124M,
# DP, TP with and without SP, PP under each schedule, CP's ring and all-to-all, ZeRO 0-3,
# recomputation, 1-8 ranks
SMALL = [
    "dp=1,mb=8", "dp=1,mb=4", "dp=1,mb=8,recompute=full", "dp=1,mb=8,recompute=selective",
    "dp=2,mb=4", "dp=2,zero=1,mb=4", "dp=2,zero=2,mb=4", "dp=2,zero=3,mb=4",
    "dp=4,mb=2", "dp=4,zero=2,mb=2", "dp=4,zero=3,mb=2",
    "dp=1,tp=2,sp=0,mb=8", "dp=1,tp=2,sp=1,mb=8", "dp=1,tp=4,sp=1,mb=8",
    "dp=1,pp=2,schedule=1f1b,mb=2", "dp=1,pp=2,schedule=gpipe,mb=2", "dp=1,pp=2,schedule=zb-h1,mb=2",
    "dp=1,pp=2,schedule=interleaved,vpp=2,mb=2", "dp=1,pp=2,schedule=zbv,vpp=2,mb=2",
    "dp=1,cp=2,mb=8", "dp=1,cp=2,cp_comm=a2a,mb=8",
    "dp=2,tp=2,sp=1,mb=4", "dp=2,pp=2,schedule=1f1b,mb=2", "dp=1,tp=2,sp=1,pp=2,schedule=1f1b,mb=4",
    "dp=2,cp=2,zero=1,mb=4",
    # 8 ranks (4 to a core here: the profile's rates scale with each rank's share of the cores)
    "dp=8,zero=2,mb=1", "dp=2,tp=2,sp=1,pp=2,schedule=1f1b,mb=2", "dp=2,tp=2,sp=1,cp=2,mb=2",
]
LLAMA = ["dp=1,mb=8", "dp=1,mb=8,recompute=full", "dp=2,zero=1,mb=4", "dp=2,zero=3,mb=4", "dp=1,tp=2,sp=1,mb=8",
         "dp=1,pp=2,schedule=1f1b,mb=2", "dp=1,cp=2,mb=8"]
GPT2_124M = ["dp=1,mb=4", "dp=2,zero=1,mb=2", "dp=1,tp=2,sp=1,mb=4"]
CONFIGS = ([("gpt2", "small", 8, 128, c) for c in SMALL] + [("llama3", "small", 8, 128, c) for c in LLAMA]
           + [("gpt2", "gpt2", 4, 128, c) for c in GPT2_124M])

_STEP = re.compile(r"^step\s+\d+/\d+ \|.*\(([0-9.]+) ms \|.*peak used:\s+(\d+) MB", re.M)
_PEAKS = re.compile(r"^peak used per rank \(MB\): ([0-9 ]+) \|", re.M)


def predicted(example, model, G, T, layout, ranks, profile):
    """(the prediction, its command's flags) of one configuration on this machine."""
    from infinitrain.plan import Cluster, parse, predict, refusal
    from infinitrain.plan.layouts import model_of
    config, cls, _ = model_of(model, None, example)
    c = parse(layout)
    why = refusal(c, config, cls, G, T)
    if why:
        raise SystemExit(f"{example} {model} {layout}: the examples refuse it: {why}")
    cluster = Cluster(1, ranks, os.cpu_count() or 1, 1e15)
    return predict(c, config, cls, cluster, profile, G, T), c.flags(G, T)


def measure(example, model, flags, ranks, steps, timeout):
    """(the busiest rank's peak used in bytes, the median step in seconds) of a run, or the error."""
    cmd = (start(ranks, find_mpiexec()) if ranks > 1 else []) + [
        sys.executable, "-m", f"infinitrain.examples.{example}", "--model", model, *flags,
        "--num_iteration", str(steps), "--peak_tflops", "1"]
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // ranks)))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()[-400:]}")
    rows = [(float(ms), int(mb)) for ms, mb in _STEP.findall(out.stdout)]
    peaks = _PEAKS.findall(out.stdout)
    peak_mb = max(map(int, peaks[-1].split())) if peaks else max(mb for _, mb in rows)
    times = [ms for ms, _ in rows[1:]] or [rows[0][0]]
    return peak_mb * 2**20, statistics.median(times) / 1e3


def choice(args, profile) -> int:
    """The planner's ranking of one job's layouts held against their measured steps: is its first
    choice within 10% of the best one measured?"""
    from infinitrain.plan import Cluster, best_layouts
    from infinitrain.plan.layouts import model_of
    example, model, G, T, ranks = args.choice.split(",")
    G, T, ranks = int(G), int(T), int(ranks)
    config, cls, _ = model_of(model, None, example)
    cluster = Cluster(1, ranks, os.cpu_count() or 1, 1e15)
    ranked = [pr for pr in best_layouts(ranks, config, cls, cluster, profile, G, T) if pr.fits]
    rest = ranked[args.choice_top:]
    step = max(1, len(rest) // max(1, args.choice_spread))
    chosen = ranked[:args.choice_top] + rest[::step][:args.choice_spread]
    print(f"{example} {model}, {G} x {T} on {ranks} ranks: {len(ranked)} layouts fit; measuring the planner's "
          f"best {args.choice_top} and {len(chosen) - args.choice_top} more spread over its ranking "
          f"(load average {os.getloadavg()[0]:.1f})")
    print(f"{'rank':>4} {'layout':<70} | {'ms pred':>8} {'ms meas':>8}")
    measured = []
    for pred in chosen:
        i = ranked.index(pred) + 1
        try:
            _, step_s = measure(example, model, pred.candidate.flags(G, T), ranks, args.steps, args.timeout)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"{i:>4} {pred.candidate.name:<70} | failed: {str(e)[-200:]}", flush=True)
            continue
        measured.append((step_s, i, pred))
        print(f"{i:>4} {pred.candidate.name:<70} | {pred.step_time * 1e3:8.0f} {step_s * 1e3:8.0f}", flush=True)
    if measured:
        best = min(measured)
        first = next((m for m in measured if m[1] == 1), None)
        if first:
            print(f"the first choice measured {first[0] * 1e3:.0f} ms, the best measured (#{best[1]}, "
                  f"{best[2].candidate.name}) {best[0] * 1e3:.0f} ms: {first[0] / best[0] - 1:+.0%}; load average "
                  f"{os.getloadavg()[0]:.1f} at the end")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default=None,
                   help="this machine's profile (default: calibrate one first, on --max_ranks ranks)")
    p.add_argument("--only", default=None, help="only the configurations whose line holds this text")
    p.add_argument("--max_ranks", type=int, default=8)
    p.add_argument("--steps", type=int, default=4, help="steps per run (the first is not timed)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--memory_only", action="store_true",
                   help="hold only the memory to the runs (no profile is calibrated; step times are not printed)")
    p.add_argument("--choice", default=None, metavar="EXAMPLE,MODEL,BATCH,SEQ,RANKS",
                   help="measure the planner's ranking of one job's layouts instead of the configurations")
    p.add_argument("--choice_top", type=int, default=4)
    p.add_argument("--choice_spread", type=int, default=6)
    p.add_argument("--measured", default=None, metavar="FILE",
                   help="hold the predictions to a saved table of measured runs (JSON, as --save writes) instead "
                        "of running the configurations")
    p.add_argument("--save", default=None, metavar="FILE", help="write what was measured (JSON) for --measured")
    args = p.parse_args(argv)
    from infinitrain.plan import Profile, parse
    if args.memory_only:
        profile = Profile({})
    elif args.profile is None and args.measured:
        raise SystemExit("--measured needs the --profile the predictions are made with")
    elif args.profile is None:
        args.profile = "/tmp/plan_validate_profile.json"
        calibrate = [sys.executable, "-m", "infinitrain.plan", "calibrate", "--output", args.profile]
        subprocess.run(start(args.max_ranks, find_mpiexec()) + calibrate, check=True)
    if not args.memory_only:
        profile = Profile.load(args.profile)
    if args.choice:
        return choice(args, profile)
    if args.measured:
        saved = json.loads(Path(args.measured).read_text())
        rows = [(c["example"], c["model"], c["global_batch"], c["sequence_length"], c["layout"]) for c in
                saved["configurations"]]
        runs = {row: c for row, c in zip(rows, saved["configurations"])}
        print(f"measured: {args.measured} ({saved.get('measured', 'no date')})")
    else:
        rows, runs = CONFIGS, None
    which = "none (memory only)" if args.memory_only else f"{args.profile} ({profile['name']})"
    print(f"profile {which}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at start")
    print(f"{'example':<7} {'model':<6} {'layout':<46} {'n':>2} | {'MB pred':>8} {'MB meas':>8} {'err':>6}"
          + ("" if args.memory_only else f" | {'ms pred':>8} {'ms meas':>8} {'err':>6}"))
    results = []
    for example, model, G, T, layout in rows:
        line = f"{example} {model} {layout}"
        if args.only and args.only not in line:
            continue
        ranks = parse(layout).world_size
        if ranks > args.max_ranks:
            continue
        pred, flags = predicted(example, model, G, T, layout, ranks, profile)
        mem_pred = pred.memory_per_rank - pred.memory.get("process", 0.0)
        t0 = time.perf_counter()
        if runs is not None:  # the saved passes: the busiest rank's peak and the mean of their steps
            run = runs[(example, model, G, T, layout)]
            mem, step = max(run["peak_used_mb"]) * 2**20, statistics.mean(run["step_ms"]) / 1e3
        else:
            try:
                mem, step = measure(example, model, flags, ranks, args.steps, args.timeout)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"{example:<7} {model:<6} {layout:<46} {ranks:>2} | failed: {e}", flush=True)
                continue
        e_mem, e_time = mem_pred / mem - 1, pred.step_time / step - 1
        results.append({"example": example, "model": model, "global_batch": G, "sequence_length": T,
                        "layout": layout, "ranks": ranks, "peak_used_mb": [round(mem / 2**20)],
                        "step_ms": [round(step * 1e3)], "predicted_mb": round(mem_pred / 2**20),
                        "predicted_ms": round(pred.step_time * 1e3), "memory_error": e_mem, "time_error": e_time})
        timing = "" if args.memory_only else \
            f" | {pred.step_time * 1e3:8.0f} {step * 1e3:8.0f} {e_time:+6.0%}"
        took = "" if runs is not None else f"   ({time.perf_counter() - t0:.0f} s)"
        print(f"{example:<7} {model:<6} {layout:<46} {ranks:>2} | {mem_pred / 2**20:8.0f} {mem / 2**20:8.0f} "
              f"{e_mem:+6.0%}{timing}{took}", flush=True)
    if results:
        summary(results, args.memory_only)
    if args.save and runs is None:
        kept = [{k: r[k] for k in ("example", "model", "global_batch", "sequence_length", "layout", "ranks",
                                   "peak_used_mb", "step_ms")} for r in results]
        Path(args.save).write_text(json.dumps({
            "machine": os.uname().nodename, "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "step_ms": f"the median of steps 2-{args.steps}", "configurations": kept}, indent=1) + "\n")
        print(f"wrote {args.save}")
    return 0


def summary(results, memory_only: bool) -> None:
    """The counts within the issue's bars, and the step-time errors' medians by ranks."""
    n = len(results)
    mem_ok = sum(abs(r["memory_error"]) <= 0.10 for r in results)
    text = f"{n} configurations: memory within 10% for {mem_ok} ({mem_ok / n:.0%})"
    if not memory_only:
        time_ok = sum(abs(r["time_error"]) <= 0.15 for r in results)
        by_ranks = {}
        for r in results:
            by_ranks.setdefault(r["ranks"], []).append(r["time_error"])
        text += f", step time within 15% for {time_ok} ({time_ok / n:.0%}); median step-time error " + ", ".join(
            f"{statistics.median(e):+.0%} at {k} rank{'s' if k > 1 else ''}" for k, e in sorted(by_ranks.items()))
    print(f"{text}; load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    sys.exit(main())
