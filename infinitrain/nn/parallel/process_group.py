"""ProcessGroup: the backend-neutral interface of collectives over a set of ranks, each
returning a Work. Backends sit beside it, chosen by device: `mpi.py` (CPU tensors, mpi4py on
the tensors' own memory) and, with the CUDA path, NCCL (bootstrapped through MPI).
"""
from __future__ import annotations

import functools
import inspect
import os
from enum import Enum
from math import prod

from ... import _trace
from ...tensor import Tensor
from . import watchdog


# TORCH_DISTRIBUTED_DEBUG=DETAIL, PyTorch's switch: before each collective the ranks of its group
# exchange what they pass (the operation, dtypes, shapes, reduction, root) and, where they differ,
# raise the same error on every rank naming each rank's call, where they would otherwise return
# garbage (equal byte counts) or fail deep in MPI. One small exchange per collective.
CHECK_COLLECTIVES = os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL"
_POINT_TO_POINT = frozenset(("send", "recv", "isend", "irecv"))
# every other operation writes into its first tensor (all_reduce's, broadcast's, the output of
# all_gather, reduce_scatter and all_to_all_single, irecv's buffer)
_WRITE_NOTHING = frozenset(("send", "isend", "barrier"))
_ROWS_DIFFER = frozenset(("all_to_all_single",))  # each rank sends and receives its own number of rows


class CollectiveError(RuntimeError):
    """Ranks that called a collective differently, or a collective the backend failed: the
    message names the group, the call and the ranks (the same on every rank of the group)."""


def _signature(name: str, args, kwargs) -> str:
    """What a rank passes to a collective, as comparable text: 'all_reduce float32[4, 8] SUM'."""
    parts = [name]
    rows_differ = name in _ROWS_DIFFER
    for a in (*args, *kwargs.values()):
        if isinstance(a, Tensor):
            shape = list(a._shape)
            parts.append(f"{a.dtype.name}{['*', *shape[1:]] if rows_differ and shape else shape}")
        elif isinstance(a, ReduceOp):
            parts.append(a.name)
        elif isinstance(a, (int, str)) and not isinstance(a, bool):
            parts.append(str(a))  # broadcast's root, a reduction named by a string
    return " ".join(parts)


def check_agreement(group, name: str, args, kwargs) -> None:
    """Raise CollectiveError on every rank of `group` unless all pass the same (DETAIL mode).
    The exchange runs on a duplicate of the group's communicator: its own traffic never meets
    the collectives in flight (a communication thread may be running one)."""
    mine = _signature(name, args, kwargs)
    checker = group.__dict__.get("_agreement_comm")
    if checker is None:
        checker = group._agreement_comm = group.comm.Dup()
        group._agreement_calls = 0
    group._agreement_calls += 1
    theirs = checker.allgather(mine)
    if any(t != mine for t in theirs):
        calls = "; ".join(f"rank {group.ranks[i]}: {t}" for i, t in enumerate(theirs))
        raise CollectiveError(
            f"collective #{group._agreement_calls} of group {getattr(group, 'name', 'group')}{list(group.ranks)} "
            f"was called differently by its ranks ({calls}): every rank of a group must call the same "
            "collectives in the same order with the same dtypes and shapes")


def _backend_error(group, name: str, e: BaseException) -> BaseException:
    """An error MPI raised inside a collective (its own stack of codes) as one CollectiveError
    that names the call and the likely cause."""
    text = e.Get_error_string() if hasattr(e, "Get_error_string") else str(e)
    return CollectiveError(
        f"{name} on group {getattr(group, 'name', 'group')}{list(group.ranks)} failed in MPI: {text.strip()}. "
        "The ranks probably called it with different sizes; run with TORCH_DISTRIBUTED_DEBUG=DETAIL to "
        "compare each collective's arguments across the ranks")


def traced_collective(payload: int | None):
    """Decorator for a backend's operations: while a profiler runs, records the call with the
    bytes of its argument number `payload` (the data that travels) and the group's size; while
    a watchdog runs, enters it in the flight recorder until it completes (a returned Work: when
    that completes). The tensor an operation writes into (its first) moves to a new version."""
    def wrap(fn):
        name = fn.__name__

        checked = name not in _POINT_TO_POINT
        written = None if name in _WRITE_NOTHING else list(inspect.signature(fn).parameters)[1]  # (after self)

        @functools.wraps(fn)
        def call(self, *args, **kwargs):
            result = run(self, *args, **kwargs)
            if written is not None:
                t = args[0] if args else kwargs.get(written)
                if isinstance(t, Tensor):
                    # as an in-place op's write, when it is launched (it lands when the Work
                    # completes, which whoever reads the values waits for anyway): what compares
                    # versions sees it (autograd's saved tensors, the offloaded optimizer's host
                    # masters, autocast's cast cache). PyTorch's c10d ops move no version; here a
                    # collective into a tensor saved for backward is an error at backward, not a
                    # gradient silently computed from the overwritten values
                    t._storage.version += 1
            return result

        def run(self, *args, **kwargs):
            rec, flight = _trace.active, watchdog.recorder
            if CHECK_COLLECTIVES and checked and self.size > 1:
                # recorded as an operation of its own: a rank that never comes to the exchange
                # is then a hang the watchdog names, as it would be in the collective itself
                check = flight.start(self, f"{name} (argument check)", 0) if flight is not None else None
                try:
                    check_agreement(self, name, args, kwargs)
                finally:
                    if check is not None:
                        flight.done(check)
            if rec is None and flight is None:
                try:
                    return fn(self, *args, **kwargs)
                except Exception as e:
                    if type(e).__module__ != "mpi4py.MPI":
                        raise
                    raise _backend_error(self, name, e) from None
            nbytes = args[payload].nbytes if payload is not None else 0
            entry = flight.start(self, name, nbytes) if flight is not None else None
            t0 = _trace.now() if rec is not None else 0.0
            try:
                result = fn(self, *args, **kwargs)
            except BaseException as e:
                if entry is not None:  # failed, not hung: the error tells, the watchdog must not
                    flight.done(entry)
                if type(e).__module__ != "mpi4py.MPI":
                    raise
                raise _backend_error(self, name, e) from None
            finally:
                if rec is not None:
                    rec.add(name, "comm", t0, {"bytes": nbytes, "ranks": self.size,
                                               "async": bool(kwargs.get("async_op", False))})
            if entry is not None:
                if isinstance(result, Work) and not result._done:
                    result._flight = entry
                else:
                    flight.done(entry)
            return result
        return call
    return wrap


class ReduceOp(Enum):
    SUM = "sum"
    AVG = "avg"
    MAX = "max"
    MIN = "min"
    PRODUCT = "product"  # the MPI backend's (MPI_PROD); the native NCCL communicator has no product


class Work:
    """A collective in flight: wait() blocks until it is done (then runs its epilogue, such as
    averaging or converting back from float32); is_completed() polls. This base completes
    through an Event set by a communication thread (or is done at once without one); a
    backend overrides `_test`/`_block` for its own requests."""

    _flight = None  # its flight-recorder entry, while a watchdog runs

    def __init__(self, epilogue=None, event=None, keep=()):
        self._epilogue = epilogue
        self._event = event
        self._error = None
        self._done = False
        self._keep = keep  # tensors the operation still uses: alive until it is done

    def is_completed(self) -> bool:
        if self._done:
            return True
        if self._test():
            self._finish()
        return self._done

    def _test(self) -> bool:
        return self._event is None or self._event.is_set()

    def _block(self) -> None:
        if self._event is not None:
            self._event.wait()

    def wait(self) -> None:
        if self._done:
            return
        with _trace.span("wait", "comm"):
            self._block()
        self._finish()

    def _finish(self) -> None:
        self._done = True
        self._keep = ()
        if self._flight is not None:
            watchdog.FlightRecorder.done(self._flight)
        if self._error is not None:
            raise RuntimeError(f"a collective failed on the communication thread: {self._error}") \
                from self._error
        if self._epilogue is not None:
            self._epilogue()
            self._epilogue = None


class _Then(Work):
    """Completes when `first` has completed, then runs `fn`."""

    def __init__(self, first: Work, fn):
        super().__init__(epilogue=fn)
        self._first = first

    def is_completed(self) -> bool:
        if not self._done and self._first.is_completed():
            self._finish()
        return self._done

    def wait(self) -> None:
        if not self._done:
            self._first.wait()
            self._finish()


def _then(first: Work, fn) -> Work:
    return _Then(first, fn)


class ProcessGroup:
    """The backend-neutral interface; `ranks` are global ranks, `rank` this process's index."""

    ranks: list
    rank: int
    size: int
    name = "group"  # what messages and flight records call it (GlobalEnv names its groups: dp, tp, ...)
    waits_on_host = True  # Work.wait() returns when the operation is done (NCCL: orders streams)

    def open_p2p_links(self, links) -> None:
        """Readies the directed links (from index, to index, tag) that isend/irecv will use,
        called by every rank of the group with the same links (a link already open stays as
        it is). MPI needs nothing: its tags keep each link's messages apart, in order."""

    def split(self, color: int) -> "ProcessGroup":
        """The ranks of this group that pass the same color, as a group of their own on the same
        backend, in this group's rank order (MPI's Comm_split). Collective over this group."""
        colors = self.comm.allgather(color)
        members = [r for r, c in zip(self.ranks, colors) if c == color]
        return self._subgroup(self.comm.Split(color, self.rank), members)

    def _subgroup(self, comm, members: list) -> "ProcessGroup":
        raise NotImplementedError

    def _done(self, work: Work, async_op: bool):
        """What a collective returns: its Work when asynchronous, else nothing once it is done."""
        if async_op:
            return work
        work.wait()
        return None

    def _check_gathered(self, what: str, whole: Tensor, piece: Tensor) -> None:
        """all_gather's out and reduce_scatter's input hold `size` pieces of the other's shape."""
        if prod(whole._shape) != prod(piece._shape) * self.size or whole.dtype is not piece.dtype:
            raise ValueError(f"{what}: the whole tensor must hold {self.size} x {tuple(piece.shape)} "
                             f"{piece.dtype.name}, got {tuple(whole.shape)} {whole.dtype.name}")

    def _all_to_all_splits(self, output: Tensor, input: Tensor, output_split_sizes,  # noqa: A002
                           input_split_sizes) -> tuple:
        """all_to_all_single's contract, checked: (elements per row, [elements to each rank],
        [their offsets in input], [elements from each rank], [their offsets in output]). Rows are
        input's and output's first dimension; a split list (None: equal parts) gives the rows to
        (from) each rank of the group in rank order, and must add up to the tensor's rows."""
        if output.dtype is not input.dtype:
            raise ValueError(f"all_to_all_single: output is {output.dtype.name} but input is {input.dtype.name}")
        if tuple(output._shape[1:]) != tuple(input._shape[1:]):
            raise ValueError(f"all_to_all_single: output {tuple(output.shape)} and input {tuple(input.shape)} "
                             "must have the same shape past the first dimension")
        row = prod(input._shape[1:])
        plans = []
        for what, t, splits in (("input", input, input_split_sizes), ("output", output, output_split_sizes)):
            rows = t._shape[0] if t.ndim else 1
            if splits is None or len(splits) == 0:
                if rows % self.size:
                    raise ValueError(f"all_to_all_single: {what}'s {rows} rows do not split into {self.size} equal "
                                     f"parts; give {what}_split_sizes")
                splits = [rows // self.size] * self.size
            splits = [int(n) for n in splits]
            if len(splits) != self.size or any(n < 0 for n in splits) or sum(splits) != rows:
                raise ValueError(f"all_to_all_single: {what}_split_sizes {splits} must be {self.size} counts >= 0 "
                                 f"adding up to {what}'s {rows} rows")
            counts = [n * row for n in splits]
            plans.append((counts, [sum(counts[:k]) for k in range(self.size)]))
        (send, send_at), (recv, recv_at) = plans
        return row, send, send_at, recv, recv_at

    def all_reduce(self, t: Tensor, op: ReduceOp = ReduceOp.SUM, async_op: bool = False): ...
    def all_gather(self, out: Tensor, t: Tensor, async_op: bool = False): ...
    def reduce_scatter(self, out: Tensor, t: Tensor, op: ReduceOp = ReduceOp.SUM, async_op: bool = False): ...
    def broadcast(self, t: Tensor, src: int = 0, async_op: bool = False): ...
    def all_to_all_single(self, output: Tensor, input: Tensor, output_split_sizes=None,  # noqa: A002
                          input_split_sizes=None, async_op: bool = False): ...
    def send(self, t: Tensor, dst: int, tag: int = 0): ...
    def recv(self, t: Tensor, src: int, tag: int = 0): ...
    def isend(self, t: Tensor, dst: int, tag: int = 0) -> Work: ...
    def irecv(self, t: Tensor, src: int, tag: int = 0) -> Work: ...
    def barrier(self): ...




# The data-parallel group of the job that parallel.init() set up: what DistributedDataParallel
# reduces over when its caller names no group (as PyTorch's DDP takes the default group).
_default_dp_group = None


def sum_host_array(values, groups, device):
    """A host (numpy) array summed over each group of `groups` in turn (None skipped), through a
    float64 tensor on `device` (a GPU job's groups are NCCL's): the counts and figures a
    trainer logs or balances by. Collective over every group given."""
    import numpy as np
    from ...creation import from_numpy
    groups = [g for g in groups if g is not None and g.size > 1]
    if not groups:
        return np.asarray(values, dtype=np.float64)
    t = from_numpy(np.array(values, dtype=np.float64)).to(device=device)
    for group in groups:
        group.all_reduce(t, ReduceOp.SUM)
    return t.cpu().numpy()


def set_default_data_parallel_group(group) -> None:
    global _default_dp_group
    _default_dp_group = group


def default_data_parallel_group():
    if _default_dp_group is None:
        raise RuntimeError("no process group: call infinitrain.distributed.init_process_group() (or "
                           "infinitrain.nn.parallel.init()) first, or pass process_group=")
    return _default_dp_group
