"""The profiler (PyTorch's names): what ran, for how long, on which thread.

    with infinitrain.profiler.profile() as prof:
        ...train a few steps...
    print(prof.table())                      # by total time: calls, total, self, mean, % of wall
    prof.export_chrome_trace("trace.json")   # chrome://tracing or ui.perfetto.dev
    prof.communication_overlap()             # how much communication ran beside kernels

On a GPU the host only queues the work, so its clock says little of where the time goes:
there (profile(device=...), by default the first GPU when there is one) every span also
records a CUDA event pair on the current stream, and the table gains the GPU's time per row
(from its first kernel's start to its last one's end, launch gaps inside included) and, under
it, how much of the wall time the GPU was busy with the profiled kernels (the rest it waited
for the host). The Chrome trace shows those kernels on a GPU track.

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
from . import cuda
from .device import device as as_device

record_function = _trace.span  # `with record_function("name"):` marks a region


class _GpuClock:
    """Timing events on one GPU, reused from one profiling window to the next."""

    def __init__(self, dev):
        self.device = dev
        self.free, self.used = [], []

    def mark(self):
        event = self.free.pop() if self.free else cuda.Event(self.device, enable_timing=True)
        event.record()  # on the calling thread's current stream
        self.used.append(event)
        return event

    def release(self) -> None:
        self.free += self.used
        self.used = []


def _gpu_clock(dev):
    if dev is None:
        return _GpuClock(as_device("cuda")) if cuda.is_available() else None
    dev = as_device(dev)
    return _GpuClock(dev) if dev.type == "cuda" else None


class profile:
    """device: the GPU whose time is recorded beside the host's (None: the first GPU, if any;
    "cpu": the host's clock only)."""

    def __init__(self, device=None):
        self._rec = None
        self.wall_ns = 0
        self._clock = _gpu_clock(device)
        self.gpu_spans = {}  # index in events -> (start, end) ns on the GPU, from the profile's start
        self.gpu_busy_ns = None

    def __enter__(self) -> "profile":
        if _trace.active is not None:
            raise RuntimeError("a profiler is running already")
        self._rec = _trace.Recorder(self._clock)
        # anchors this process's monotonic clock to the wall clock, so ranks line up
        self._epoch = time.time_ns() - time.perf_counter_ns()
        self._t0 = time.perf_counter_ns()
        self._gpu_t0 = self._clock.mark() if self._clock is not None else None
        _trace.active = self._rec
        return self

    def __exit__(self, *exc) -> bool:
        _trace.active = None
        self.wall_ns = time.perf_counter_ns() - self._t0
        if self._clock is not None:
            self._read_gpu_clock()
        return False

    def _read_gpu_clock(self) -> None:
        """The GPU time of every span timed (waits for the GPU to reach the last event)."""
        origin = self._gpu_t0
        self.gpu_spans = {i: (int(origin.elapsed_time(start) * 1e6), int(origin.elapsed_time(end) * 1e6))
                          for i, (start, end) in self._rec.gpu_pairs.items()}
        kernels = [list(span) for i, span in self.gpu_spans.items() if self.events[i][1] == "kernel"]
        self.gpu_busy_ns = sum(t1 - t0 for t0, t1 in _union(kernels))
        self._rec.gpu_pairs, self._rec.gpu_starts = {}, {}
        self._clock.release()

    @property
    def events(self) -> list:
        return self._rec.events if self._rec is not None else []

    # ---- the table --------------------------------------------------------------------------
    def key_averages(self) -> list:
        """One row per (category, name): calls, total ns, self ns (less the spans nested inside,
        on the same thread), bytes moved (collectives), GPU ns (0 without a GPU clock); sorted by
        total time."""
        self_ns = self._self_times()
        rows = defaultdict(lambda: {"calls": 0, "total_ns": 0, "self_ns": 0, "bytes": 0, "gpu_ns": 0})
        for i, (name, cat, _tid, t0, t1, args) in enumerate(self.events):
            r = rows[(cat, name)]
            r["calls"] += 1
            r["total_ns"] += t1 - t0
            r["self_ns"] += self_ns[i]
            if i in self.gpu_spans:
                r["gpu_ns"] += self.gpu_spans[i][1] - self.gpu_spans[i][0]
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
        if sort_by not in ("total", "self", "gpu"):
            raise ValueError(f"sort_by must be 'total', 'self' or 'gpu', not {sort_by!r}")
        if sort_by != "total":
            rows.sort(key=lambda r: -r[f"{sort_by}_ns"])
        wall = max(self.wall_ns, 1)
        gpu = self.gpu_busy_ns is not None
        lines = [f"{'name':<34} {'category':<9} {'calls':>7} {'total ms':>10} {'self ms':>9} "
                 f"{'mean us':>9} {'% wall':>7}" + (f" {'GPU ms':>9} {'% wall':>7}" if gpu else "")
                 + f" {'MB moved':>9}"]
        for r in rows[:row_limit]:
            mb = f"{r['bytes'] / 2**20:9.2f}" if r["bytes"] else f"{'':>9}"
            gpu_cols = f" {r['gpu_ns'] / 1e6:9.2f} {100 * r['gpu_ns'] / wall:6.1f}%" if gpu else ""
            lines.append(f"{r['name'][:34]:<34} {r['category']:<9} {r['calls']:7d} "
                         f"{r['total_ns'] / 1e6:10.2f} {r['self_ns'] / 1e6:9.2f} "
                         f"{r['total_ns'] / r['calls'] / 1e3:9.1f} {100 * r['total_ns'] / wall:6.1f}%{gpu_cols} {mb}")
        lines.append(f"{len(self.events)} events over {self.wall_ns / 1e6:.1f} ms of wall time "
                     f"({len(rows)} distinct)")
        if gpu:
            lines.append(f"GPU ({self._clock.device}) busy with these kernels {self.gpu_busy_ns / 1e6:.1f} ms "
                         f"({100 * self.gpu_busy_ns / wall:.1f}% of the wall time); the rest it waited for the host")
        return "\n".join(lines)

    # ---- communication hidden behind computation ----------------------------------------------
    def communication_overlap(self) -> dict:
        """How much of this rank's communication ran while it computed (the communication /
        computation overlap of Holistic Trace Analysis, from the trace): `comm_ns` is the time
        during which bytes were moving (a synchronous collective's call, a wait on an
        asynchronous one, a transfer on the communication thread's track), `hidden_ns` the part
        of it during which a kernel ran on another thread, `share` their ratio (None without
        communication). An asynchronous call only queues its collective and is not counted."""
        return communication_overlap((cat, t0, t1, args) for _name, cat, _tid, t0, t1, args in self.events)

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
        if self.gpu_spans:  # the kernels on the GPU's clock, anchored where the profile began
            gpu_tid = len(tids)
            out.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": gpu_tid,
                        "args": {"name": f"GPU {self._clock.device}"}})
            for i, (g0, g1) in self.gpu_spans.items():
                name, cat = rec.events[i][:2]
                if cat == "kernel":
                    out.append({"name": name, "cat": "gpu", "ph": "X", "pid": rank, "tid": gpu_tid,
                                "ts": (self._epoch + self._t0 + g0) / 1e3, "dur": (g1 - g0) / 1e3})
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


def communication_overlap(events) -> dict:
    """Profile.communication_overlap over (category, start, end, args) spans of one rank: a
    live profile's or a Chrome trace's (python -m infinitrain.plan overlap reads those)."""
    comm, compute = [], []
    for cat, t0, t1, args in events:
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
