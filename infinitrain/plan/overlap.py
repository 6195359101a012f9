"""`python -m infinitrain.plan overlap`: a profile's overlap shares (the part of each group's
traffic the engine hides behind computation) read from the profiler's traces of real runs,
not assumed.

    mpiexec -n 2 python -m infinitrain.examples.gpt2 --model small ... --profile dp.json     # DP 2
    mpiexec -n 2 python -m infinitrain.examples.gpt2 --model small ... --tensor_parallel 2 --profile tp.json
    python -m infinitrain.plan overlap --profile profile.json dp=dp.json tp=tp.json

Each trace is a run whose communication is the one group's (DP 2 alone for dp, TP alone for tp,
CP alone for cp, ZeRO-3 for zero): in it, the time during which bytes moved on a rank (a
blocking collective, a wait on an asynchronous one, the transfer on the communication thread)
and the part of that time during which the rank computed (profiler.communication_overlap, the
overlap of Holistic Trace Analysis); the group's share is the ratio over all ranks.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

from ..profiler import communication_overlap
from .profile import OVERLAPS, Profile


def trace_overlap(path) -> dict:
    """{"ranks", "comm_ms" (per rank), "hidden_ms" (per rank), "share"} of a Chrome trace written
    by --profile (export_chrome_trace: a process per rank)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot be read as a Chrome trace ({e})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{path}: no traceEvents list: not a trace written by --profile")
    ranks = defaultdict(list)
    for i, e in enumerate(events):
        if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in ("comm", "kernel"):
            try:
                t0, t1 = float(e["ts"]) * 1e3, (float(e["ts"]) + float(e["dur"])) * 1e3
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{path}: event {i} ({e.get('name')!r}) has no numeric ts and dur: not a trace "
                                 "written by --profile") from None
            args = e.get("args")
            ranks[e.get("pid", 0)].append((e["cat"], t0, t1, args if isinstance(args, dict) else None))
    per_rank = [communication_overlap(spans) for spans in ranks.values()]
    comm = sum(r["comm_ns"] for r in per_rank)
    if not comm:
        raise ValueError(f"{path}: the trace has no communication (was it a run of one rank, or of a layout "
                         "without that group?)")
    hidden = sum(r["hidden_ns"] for r in per_rank)
    n = len(per_rank)
    return {"ranks": n, "comm_ms": comm / n / 1e6, "hidden_ms": hidden / n / 1e6, "share": hidden / comm}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m infinitrain.plan overlap", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", required=True, help="the profile whose overlap shares to set (calibrate wrote it)")
    p.add_argument("--output", default=None, help="where to write the profile (default: --profile itself)")
    p.add_argument("traces", nargs="+", metavar="GROUP=TRACE",
                   help=f"a group ({', '.join(OVERLAPS)}) and the Chrome trace of a run whose traffic is that group's")
    args = p.parse_args(argv)
    try:
        profile = Profile.load(args.profile)
        shares = {}
        for item in args.traces:
            group, sep, path = item.partition("=")
            if not sep or group not in OVERLAPS:
                raise ValueError(f"{item!r}: expected GROUP=TRACE with GROUP one of {', '.join(OVERLAPS)}")
            found = trace_overlap(path)
            shares[group] = round(found["share"], 3)
            print(f"{group}: {path}: {found['ranks']} rank(s), {found['comm_ms']:.1f} ms of communication per rank, "
                  f"{found['hidden_ms']:.1f} ms of it hidden behind computation: {found['share']:.0%}")
    except ValueError as e:
        print(f"python -m infinitrain.plan overlap: {e}", file=sys.stderr)
        return 2
    data = {**profile.data, "overlap": {**profile["overlap"], **shares}}
    sources = dict(data.get("overlap_source") or {})
    sources.update({g: path for g, _, path in (t.partition("=") for t in args.traces)})
    data["overlap_source"] = sources
    out = args.output or args.profile
    Profile(data, out).save(out)
    print(f"wrote {out}: overlap " + ", ".join(f"{k} {v:.0%}" for k, v in data["overlap"].items()))
    return 0
