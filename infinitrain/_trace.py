"""What the profiler records (and where the precision checker looks), at the bottom of the
package so that kernels, autograd and the process groups can record into it. While no
profiler runs, `active` is None and a recording site costs one global read;
infinitrain.profiler and infinitrain.precision_checker are the user-facing sides.
"""
from __future__ import annotations

import functools
import threading
import time

active = None  # the Recorder of the profiler in progress, or None
# the precision checker watching every op (level 2), or None: inspector.op(name, "forward" |
# "backward", tensors) sees each autograd op's outputs and each backward's input gradients
inspector = None


class Recorder:
    """Complete events (name, category, thread id, start ns, end ns, args), appended from any
    thread (list.append is atomic under the GIL). With a GPU clock (`gpu`: an object whose
    mark() records a timing event on the calling thread's current stream and returns it), each
    span that began with now() also gets a pair of events, kept in `gpu_pairs` by the index of
    its event: the profiler reads the GPU time between them when it stops."""

    def __init__(self, gpu=None):
        self.events = []
        self.threads = {}  # thread id -> name
        self.gpu = gpu
        self.gpu_starts = {}  # (thread id, start ns) -> the event marked when the span began
        self.gpu_pairs = {}   # index in events -> (start event, end event)

    def add(self, name: str, cat: str, t0: int, args=None) -> None:
        tid = threading.get_ident()
        if tid not in self.threads:
            self.threads[tid] = threading.current_thread().name
        if self.gpu is not None:
            start = self.gpu_starts.pop((tid, t0), None)
            if start is not None:
                self.gpu_pairs[len(self.events)] = (start, self.gpu.mark())
        self.events.append((name, cat, tid, t0, time.perf_counter_ns(), args))


def now() -> int:
    """A span's start: the host's clock, and the GPU's too while a profiler times the GPU."""
    t0 = time.perf_counter_ns()
    rec = active
    if rec is not None and rec.gpu is not None:
        rec.gpu_starts[(threading.get_ident(), t0)] = rec.gpu.mark()
    return t0


class span:
    """`with span(name, cat, args):` records the block while a profiler runs."""
    __slots__ = ("name", "cat", "args", "rec", "t0")

    def __init__(self, name: str, cat: str = "user", args=None):
        self.name, self.cat, self.args = name, cat, args

    def __enter__(self):
        self.rec = active
        if self.rec is not None:
            self.t0 = now()
        return self

    def __exit__(self, *exc):
        if self.rec is not None:
            self.rec.add(self.name, self.cat, self.t0, self.args)
        return False


def traced(cat: str):
    """Decorator: records each call of the function under its name while a profiler runs."""
    def wrap(fn):
        name = fn.__name__

        @functools.wraps(fn)
        def call(*args, **kwargs):
            rec = active
            if rec is None:
                return fn(*args, **kwargs)
            t0 = now()
            try:
                return fn(*args, **kwargs)
            finally:
                rec.add(name, cat, t0)
        return call
    return wrap
