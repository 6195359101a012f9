"""The profiler (PyTorch's names): what ran, for how long, on which thread.

    with infinitrain.profiler.profile() as prof:
        ...train a few steps...
    print(prof.table())                      # by total time: calls, total, self, mean, % of wall
    prof.export_chrome_trace("trace.json")   # chrome://tracing or ui.perfetto.dev
    prof.communication_overlap()             # how much communication ran beside kernels

Recorded while it runs: every autograd op's forward (category "op") and backward ("backward"),
every native kernel call ("kernel"), every collective with the bytes it moves and waits on
them ("comm"; under a communication thread, also the transfer itself on that thread's track),
and regions named with `record_function` ("user"). Spans nest (an op holds its kernels), so
the table gives both total and self time. With no profiler running, each of those places
costs one read of a module global.

Under several ranks, `export_chrome_trace(path, group)` gathers every rank's events to the
group's first rank, which writes one file: a process per rank, a track per thread, on one
clock (each rank's monotonic clock anchored to the wall clock when profiling began).
"""
from __future__ import annotations

import json
import time
from collections import defaultdict

from . import _trace

record_function = _trace.span  # `with record_function("name"):` marks a region


class profile:
    def __init__(self):
        self._rec = None
        self.wall_ns = 0

    def __enter__(self) -> "profile":
        if _trace.active is not None:
            raise RuntimeError("a profiler is running already")
        self._rec = _trace.Recorder()
        # anchors this process's monotonic clock to the wall clock, so ranks line up
        self._epoch = time.time_ns() - time.perf_counter_ns()
        self._t0 = time.perf_counter_ns()
        _trace.active = self._rec
        return self

    def __exit__(self, *exc) -> bool:
        _trace.active = None
        self.wall_ns = time.perf_counter_ns() - self._t0
        return False

    @property
    def events(self) -> list:
        return self._rec.events if self._rec is not None else []

    # ---- the table --------------------------------------------------------------------------
    def key_averages(self) -> list:
        """One row per (category, name): calls, total ns, self ns (less the spans nested inside,
        on the same thread), bytes moved (collectives); sorted by total time."""
        self_ns = self._self_times()
        rows = defaultdict(lambda: {"calls": 0, "total_ns": 0, "self_ns": 0, "bytes": 0})
        for i, (name, cat, _tid, t0, t1, args) in enumerate(self.events):
            r = rows[(cat, name)]
            r["calls"] += 1
            r["total_ns"] += t1 - t0
            r["self_ns"] += self_ns[i]
            if args and "bytes" in args:
                r["bytes"] += args["bytes"]
        out = [dict(r, category=c, name=n) for (c, n), r in rows.items()]
        return sorted(out, key=lambda r: -r["total_ns"])

    def _self_times(self) -> list:
        ev = self.events
        self_ns = [e[4] - e[3] for e in ev]
        by_thread = defaultdict(list)
        for i, e in enumerate(ev):
            by_thread[e[2]].append(i)
        for idx in by_thread.values():
            idx.sort(key=lambda i: (ev[i][3], -ev[i][4]))
            stack = []  # open spans, outermost first
            for i in idx:
                while stack and ev[stack[-1]][4] <= ev[i][3]:
                    stack.pop()
                if stack:  # i runs inside stack[-1]
                    self_ns[stack[-1]] -= ev[i][4] - ev[i][3]
                stack.append(i)
        return self_ns

    def table(self, sort_by: str = "total", row_limit: int = 30) -> str:
        rows = self.key_averages()
        if sort_by == "self":
            rows.sort(key=lambda r: -r["self_ns"])
        elif sort_by != "total":
            raise ValueError(f"sort_by must be 'total' or 'self', not {sort_by!r}")
        wall = max(self.wall_ns, 1)
        lines = [f"{'name':<34} {'category':<9} {'calls':>7} {'total ms':>10} {'self ms':>9} "
                 f"{'mean us':>9} {'% wall':>7} {'MB moved':>9}"]
        for r in rows[:row_limit]:
            mb = f"{r['bytes'] / 2**20:9.2f}" if r["bytes"] else f"{'':>9}"
            lines.append(f"{r['name'][:34]:<34} {r['category']:<9} {r['calls']:7d} "
                         f"{r['total_ns'] / 1e6:10.2f} {r['self_ns'] / 1e6:9.2f} "
                         f"{r['total_ns'] / r['calls'] / 1e3:9.1f} {100 * r['total_ns'] / wall:6.1f}% {mb}")
        lines.append(f"{len(self.events)} events over {self.wall_ns / 1e6:.1f} ms of wall time "
                     f"({len(rows)} distinct)")
        return "\n".join(lines)

    # ---- communication hidden behind computation ----------------------------------------------
    def communication_overlap(self) -> dict:
        """How much of this rank's communication ran while it computed (the communication /
        computation overlap of Holistic Trace Analysis, from the trace): `comm_ns` is the time
        during which bytes were moving (a synchronous collective's call, a wait on an
        asynchronous one, a transfer on the communication thread's track), `hidden_ns` the part
        of it during which a kernel ran on another thread, `share` their ratio (None without
        communication). An asynchronous call only queues its collective and is not counted."""
        comm, compute = [], []
        for _name, cat, _tid, t0, t1, args in self.events:
            if cat == "kernel":
                compute.append((t0, t1))
            elif cat == "comm" and not (args and args.get("async")):
                comm.append((t0, t1))
        comm, compute = _union(comm), _union(compute)
        comm_ns = sum(t1 - t0 for t0, t1 in comm)
        hidden, i, j = 0, 0, 0
        while i < len(comm) and j < len(compute):  # the two sorted unions, side by side
            lo, hi = max(comm[i][0], compute[j][0]), min(comm[i][1], compute[j][1])
            hidden += max(0, hi - lo)
            if comm[i][1] < compute[j][1]:
                i += 1
            else:
                j += 1
        return {"comm_ns": comm_ns, "hidden_ns": hidden, "share": hidden / comm_ns if comm_ns else None}

    # ---- the Chrome trace ---------------------------------------------------------------------
    def _trace_events(self, rank: int) -> list:
        rec = self._rec
        out = [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}},
               {"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}}]
        tids = {tid: k for k, tid in enumerate(rec.threads)}
        for tid, name in rec.threads.items():
            out.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tids[tid], "args": {"name": name}})
        for name, cat, tid, t0, t1, args in rec.events:
            e = {"name": name, "cat": cat, "ph": "X", "pid": rank, "tid": tids[tid],
                 "ts": (self._epoch + t0) / 1e3, "dur": (t1 - t0) / 1e3}
            if args:
                e["args"] = args
            out.append(e)
        return out

    def export_chrome_trace(self, path, group=None) -> None:
        """Writes the trace (JSON, Chrome's trace-event format). With a process group (an MPI
        one), every rank of it must call this: the group's first rank writes all ranks' events."""
        rank = group.ranks[group.rank] if group is not None else 0
        events = self._trace_events(rank)
        if group is not None and group.size > 1:
            gathered = group.comm.gather(events, root=0)
            if group.rank != 0:
                return
            events = [e for part in gathered for e in part]
        with open(path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)


def _union(spans: list) -> list:
    """Sorted, non-overlapping intervals covering the same time as `spans`."""
    out = []
    for t0, t1 in sorted(spans):
        if out and t0 <= out[-1][1]:
            if t1 > out[-1][1]:
                out[-1][1] = t1
        else:
            out.append([t0, t1])
    return out
