"""What moves between a GPU and the host while backward goes on, for OffloadOptimizer: the
gradients' copies to the host (GradCopies), and, where the caller knows that nothing changes
the gradients after backward, the host's update of each parameter as soon as its gradient has
landed, with its weights copied back (EarlyUpdates): ZeRO-Offload's schedule, in which the
gradients' copies hide behind backward, taken one step further so that the host's update hides
there too."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from .. import _trace, cuda
from ..autograd import no_grad
from ..runtime import get_num_threads, set_num_threads

UPDATE_BATCH = 4 * 2**20  # parameters' elements updated on the host in one go, before their copies back


def update_batch(params) -> int:
    """How many elements the host updates in one go: UPDATE_BATCH, or an eighth of a smaller
    model's (so that its copies back still overlap the updates)."""
    return min(UPDATE_BATCH, max(1, sum(p.numel() for p in params) // 8))


class GradCopies:
    """Gradient copies to the host queued on a stream of their own, and what the step must know
    of them: which parameters were streamed (`streamed`), the events that mark them done and the
    device gradients they read (kept alive until then), a clipping factor to apply after."""

    def __init__(self, params):
        self.device = next(p.device for p in params if p.device.type != "cpu")
        self.stream = cuda.Stream(self.device)
        self.clear()

    def clear(self) -> None:
        self.armed, self.streamed, self.pending, self.factor, self.bytes = False, set(), [], None, 0

    def queue(self, items, after=None):
        """items: (host tensor, parameter index, device gradient); after: a cuda.Event the copies
        follow (None: the current stream as it stands). Returns the event that marks them done."""
        if after is None:
            after = cuda.Event(self.device)
            after.record()
        self.stream.wait_event(after)
        nbytes = sum(g.nbytes for _, _, g in items)
        with cuda.stream(self.stream), _trace.span("offload gradients", "memcpy", {"bytes": nbytes}):
            for host, i, g in items:
                host.copy_(g, non_blocking=True)
                self.streamed.add(i)
        self.bytes += nbytes
        self.pending.append((self.stream.record_event(), [g for _, _, g in items]))
        return self.pending[-1][0]

    def wait(self) -> None:
        """The host waits for every queued copy."""
        for done, _ in self.pending:
            done.synchronize()
        self.pending = []

    def fence(self) -> None:
        """The current stream waits for every queued copy (the host does not): what it queues
        next may change the gradients they read, so nothing more streams until re-armed."""
        self.armed = False
        if self.pending:
            self.pending[-1][0].wait()


class EarlyUpdates:
    """The host's updates made during one backward, by one worker thread: for each batch of
    parameters handed over (their gradients' copies queued, `landed` the event after them) it
    waits for the copies, runs the optimizer's update on the master weights and queues the
    weights' copies back to the GPU on the copy stream. A parameter's gradient is final when it
    is handed over, and everything on the GPU that reads the weight is queued before that, so
    the copy back may overwrite it while backward goes on. finish() joins the worker and makes
    the current stream wait for the copies back before the next forward."""

    def __init__(self, owner, hold, before=frozenset()):
        self.owner, self.hold = owner, hold  # hold: indices whose gradients change after backward
        self.before = before  # indices updated by an earlier backward of the same step
        self.done, self.futures, self.copied = set(), [], None
        self.handed, self.lock = [], threading.Lock()  # (indices, the event after their copies), not yet taken
        self.handed_numel = 0
        if owner._pool is None:
            owner._pool = ThreadPoolExecutor(1, thread_name_prefix="offload-update")
            # the worker leaves a core to the thread that queues backward's kernels. OpenMP's count
            # is the calling thread's own, but set_num_threads sets OpenBLAS's too, for the whole
            # process (infinitrain.h has no OpenMP-only setter): the caller sets its count again
            # (OpenMP's unchanged, OpenBLAS's back); the update uses no BLAS
            threads = get_num_threads()
            owner._pool.submit(set_num_threads, max(1, threads - 1)).result()
            set_num_threads(threads)

    def submit(self, ids, landed) -> None:
        off = self.owner
        # checked before the filter below: once the worker has copied a parameter back, its
        # version has moved, and the filter would drop a second arrival without a word
        again = [f"parameter {i} {tuple(off.params[i].shape)}" for i in ids if i in self.done or i in self.before]
        if again:
            raise RuntimeError(f"OffloadOptimizer: the gradient of {', '.join(again)} arrived twice in one backward, "
                               "after the host had updated it: updating during backward needs each gradient once")
        # a weight written behind the optimizer's back is read back at the step, as without this
        ids = [i for i in ids if i not in self.hold and off.masters[i] is not None and off._current(i)]
        if ids:
            self.done.update(ids)
            with self.lock:
                self.handed.append((ids, landed))
            # the worker wakes for a batch, not for each parameter: every wake-up takes the
            # interpreter's lock from the thread that queues backward's kernels
            self.handed_numel += sum(off.params[i].numel() for i in ids)
            if self.handed_numel >= off.update_batch:
                self.handed_numel = 0
                self.futures.append(off._pool.submit(self._run))

    @no_grad()
    def _run(self) -> None:
        """Everything handed over since the worker last looked, in one go: the copies are queued
        in order on one stream, so the last one's event says they have all landed."""
        with self.lock:
            handed, self.handed = self.handed, []
        if not handed:
            return
        off = self.owner
        handed[-1][1].synchronize()
        ids = [i for batch, _ in handed for i in batch]
        with _trace.span("offload update", "user", {"parameters": len(ids)}):
            off._update_params(ids)
        with cuda.stream(off._copies.stream):
            try:
                for i in ids:
                    off.params[i].detach().copy_(off.masters[i], non_blocking=True)
            finally:  # the copies queued before a failure are ordered too (finish)
                self.copied = off._copies.stream.record_event()

    def finish(self) -> set:
        """Waits for the worker, orders the current stream after the weights copied back, then
        raises what the worker raised (no master is then taken as current: the next step reads
        the weights back); returns the indices updated."""
        error = None
        try:
            self.futures.append(self.owner._pool.submit(self._run))  # what is left
        except RuntimeError as e:  # (a pool shut down)
            error = e
        for f in self.futures:  # every one: a batch after a failed one may still queue its copies
            try:
                f.result()
            except BaseException as e:  # re-raised below, once the copies are ordered
                error = error or e
        if self.copied is not None:
            self.copied.wait()
        if error is not None:
            raise error
        for i in self.done:
            self.owner._pushed[i] = self.owner._written(i)
        return self.done
