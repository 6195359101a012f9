"""The MPI backend of ProcessGroup: mpi4py on the tensors' own memory (no copy), blocking
calls for synchronous collectives and non-blocking ones (or a communication thread) for
asynchronous ones. bfloat16 is not an MPI type: it is reduced through a float32 copy, so sums
are exact to float32 and rounded to bfloat16 once."""
from __future__ import annotations

import os

from ... import _trace
from ...tensor import Tensor
from .process_group import ProcessGroup, ReduceOp, Work, _then, traced_collective


class MPIWork(Work):
    """Completes when its MPI requests have."""

    def __init__(self, requests, epilogue=None, keep=()):
        super().__init__(epilogue=epilogue, keep=keep)
        self._requests = list(requests)

    def _test(self) -> bool:
        from mpi4py import MPI
        return MPI.Request.Testall(self._requests)

    def _block(self) -> None:
        from mpi4py import MPI
        MPI.Request.Waitall(self._requests)


class _CommThread:
    """Runs a group's collectives one after another on a thread of its own. MPI implementations
    progress non-blocking collectives only inside MPI calls, so an Iallreduce started during
    backward would sit idle until the final wait; a blocking call on this thread moves while
    the kernels compute (mpi4py and the native library both release the GIL). Collectives keep
    the order in which they were queued, the same on every rank."""

    def __init__(self, name: str):
        import queue
        import threading
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            fn, work = self._queue.get()
            try:
                with _trace.span("collective", "comm"):  # where the bytes really move
                    fn()
            except BaseException as e:  # reported by Work.wait on the caller's thread
                work._error = e
            work._event.set()
            self._queue.task_done()

    def drain(self) -> None:
        """Returns once everything queued so far has run."""
        self._queue.join()

    def submit(self, fn, epilogue=None, keep=()) -> Work:
        import threading
        work = Work(epilogue=epilogue, event=threading.Event(), keep=keep)
        self._queue.put((fn, work))
        return work


_MPI = {}  # filled on first use: mpi4py is imported only by processes that communicate


def _mpi():
    if not _MPI:
        from mpi4py import MPI
        _MPI.update(MPI=MPI, types={"float32": MPI.FLOAT, "float64": MPI.DOUBLE, "float16": MPI.UINT16_T,
                                    "int32": MPI.INT32_T, "int64": MPI.INT64_T, "uint8": MPI.UINT8_T,
                                    "bfloat16": MPI.UINT16_T},
                    # by ReduceOp's value: a str hashes in C, an Enum member in Python
                    ops={"sum": MPI.SUM, "avg": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN,
                         "product": MPI.PROD})
    return _MPI


def _mpi_op(op: ReduceOp):
    return _mpi()["ops"][op._value_]


def _buffer(t: Tensor):
    """[buffer over the tensor's own memory, MPI type]. Kept lean: tensor parallelism calls it
    several times per layer on small tensors (one pass over the shape finds both the size and
    whether the tensor is contiguous)."""
    m = _MPI or _mpi()
    mpi_type = m["types"].get(t.dtype.name)
    if mpi_type is None:
        raise TypeError(f"the MPI process group cannot communicate {t.dtype.name} tensors")
    storage = t._storage
    if storage.device.type != "cpu":
        raise ValueError(f"the MPI process group works on CPU tensors, this one is on {t.device}; "
                         "CUDA tensors use the NCCL backend")
    shape, strides = t._shape, t._strides
    if len(shape) == 1:  # the common case, without the loop
        numel = shape[0]
        if numel != 1 and strides[0] != 1:
            raise ValueError("collectives need contiguous tensors; call .contiguous() first")
    else:
        numel = 1
        for n, stride in zip(reversed(shape), reversed(strides)):
            if n != 1 and stride != numel:
                raise ValueError("collectives need contiguous tensors; call .contiguous() first")
            numel *= n
    itemsize = t.dtype.itemsize
    return [m["MPI"].buffer.fromaddress(storage.ptr + t._offset * itemsize, numel * itemsize), mpi_type]


_SUM, _AVG = ReduceOp.SUM, ReduceOp.AVG  # an Enum's class attribute costs a lookup per call

# dtypes MPI reduces natively (16-bit floats go through a float32 copy)
_NATIVE = frozenset(("float32", "float64", "int32", "int64"))


class MPIProcessGroup(ProcessGroup):
    def __init__(self, comm, ranks):
        from mpi4py import MPI
        self.comm = comm
        self.ranks = list(ranks)
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        # A communication thread needs MPI_THREAD_MULTIPLE (mpi4py's default) and a core to run
        # on: it is used when each rank has two or more cores (or INFINITRAIN_COMM_THREAD=1);
        # otherwise asynchronous collectives are MPI non-blocking calls that the caller
        # advances with is_completed() (DDP does so from its gradient hooks).
        wanted = os.environ.get("INFINITRAIN_COMM_THREAD")
        if wanted is None:
            from ...runtime import get_num_threads
            wanted = "1" if get_num_threads() >= 2 else "0"
        threaded = wanted == "1" and self.size > 1 and MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self._comm_thread = _CommThread(f"infinitrain-comm-{self.ranks}") if threaded else None

    def __repr__(self) -> str:
        return f"MPIProcessGroup(ranks={self.ranks})"

    def _subgroup(self, comm, members: list) -> "MPIProcessGroup":
        return MPIProcessGroup(comm, members)

    @traced_collective(0)
    def all_reduce(self, t: Tensor, op: ReduceOp = ReduceOp.SUM, async_op: bool = False):
        if op.__class__ is not ReduceOp:
            op = ReduceOp(op)
        m = _MPI or _mpi()
        if not async_op and self._comm_thread is None and op is not _AVG \
                and t.dtype.name in _NATIVE:  # the commonest call, with the least Python of all
            self.comm.Allreduce(m["MPI"].IN_PLACE, _buffer(t), op=m["ops"][op._value_])
            return None
        MPI = m["MPI"]
        if t.dtype.name in ("bfloat16", "float16"):
            # not MPI types: reduce a float32 copy, write back once it is done
            wide = t.float()
            inner = self.all_reduce(wide, op, async_op=True)
            return self._done(_then(inner, lambda: t.copy_(wide)), async_op)
        if op is _AVG and not t.dtype.is_floating_point:
            raise TypeError(f"all_reduce AVG of {t.dtype.name} tensors is not defined; use SUM")
        buf, mop = _buffer(t), _mpi_op(op)
        scale = 1.0 / self.size
        epilogue = (lambda: t.mul_(scale)) if op is _AVG and self.size > 1 else None
        return self._collective(lambda: self.comm.Allreduce(MPI.IN_PLACE, buf, op=mop),
                                lambda: self.comm.Iallreduce(MPI.IN_PLACE, buf, op=mop),
                                epilogue, async_op, (t,))

    def _collective(self, blocking, nonblocking, epilogue, async_op: bool, keep=()):
        """Synchronous calls block (cheapest when the caller waits anyway), after whatever the
        communication thread still has queued, so that every rank sees one order; asynchronous
        ones go to the communication thread, or else to MPI's non-blocking call. keep: the
        tensors whose memory the call reads or writes (MPI sees only addresses), held by the
        Work until it is done, so that a temporary the caller drops is not reused meanwhile."""
        if not async_op:
            if self._comm_thread is not None:
                self._comm_thread.drain()
            blocking()
            if epilogue is not None:
                epilogue()
            return None
        if self._comm_thread is not None:
            return self._comm_thread.submit(blocking, epilogue, keep)
        return MPIWork([nonblocking()], epilogue, keep)

    @traced_collective(0)
    def all_gather(self, out: Tensor, t: Tensor, async_op: bool = False):
        """out [size * n, ...] = the ranks' t [n, ...] in rank order."""
        self._check_gathered("all_gather", out, t)
        src, dst = _buffer(t), _buffer(out)
        if not async_op and self._comm_thread is None:
            self.comm.Allgather(src, dst)
            return None
        return self._collective(lambda: self.comm.Allgather(src, dst),
                                lambda: self.comm.Iallgather(src, dst), None, async_op, (out, t))

    @traced_collective(1)
    def reduce_scatter(self, out: Tensor, t: Tensor, op: ReduceOp = ReduceOp.SUM,
                       async_op: bool = False):
        """out [n, ...] = this rank's block of the reduction of t [size * n, ...]. out may be
        that block of t itself (in place, NCCL's convention; t's other blocks are left undefined)."""
        self._check_gathered("reduce_scatter", t, out)
        in_place = out._storage is t._storage
        if not async_op and self._comm_thread is None and op is _SUM \
                and t.dtype.name in _NATIVE and not in_place:  # the common case, with the least Python
            self.comm.Reduce_scatter_block(_buffer(t), _buffer(out), op=(_MPI or _mpi())["ops"]["sum"])
            return None
        op = ReduceOp(op)
        if t.dtype.name in ("bfloat16", "float16"):
            wide_in, wide_out = t.float(), out.float()
            inner = self.reduce_scatter(wide_out, wide_in, op, async_op=True)
            return self._done(_then(inner, lambda: out.copy_(wide_out)), async_op)
        scale = 1.0 / self.size
        if in_place:  # MPI's in-place form leaves this rank's block at the front of t
            n = out.numel()
            if not (t.is_contiguous() and out.is_contiguous() and out._offset == t._offset + self.rank * n):
                raise ValueError("reduce_scatter in place: out must be this rank's block of t "
                                 f"(elements {self.rank * n} to {(self.rank + 1) * n})")
            MPI, buf, mop = _mpi()["MPI"], _buffer(t), _mpi_op(op)
            front = t.view(-1)[:n].view(*out.shape)

            def epilogue():
                if self.rank:
                    out.copy_(front)
                if op is _AVG and self.size > 1:
                    out.mul_(scale)
            return self._collective(lambda: self.comm.Reduce_scatter_block(MPI.IN_PLACE, buf, op=mop),
                                    lambda: self.comm.Ireduce_scatter_block(MPI.IN_PLACE, buf, op=mop),
                                    epilogue, async_op, (out, t))
        src, dst, mop = _buffer(t), _buffer(out), _mpi_op(op)
        epilogue = (lambda: out.mul_(scale)) if op is _AVG and self.size > 1 else None
        return self._collective(lambda: self.comm.Reduce_scatter_block(src, dst, op=mop),
                                lambda: self.comm.Ireduce_scatter_block(src, dst, op=mop),
                                epilogue, async_op, (out, t))

    @traced_collective(0)
    def broadcast(self, t: Tensor, src: int = 0, async_op: bool = False):
        """src is an index into this group's ranks."""
        buf = _buffer(t)
        return self._collective(lambda: self.comm.Bcast(buf, root=src),
                                lambda: self.comm.Ibcast(buf, root=src), None, async_op, (t,))

    @traced_collective(1)
    def all_to_all_single(self, output: Tensor, input: Tensor, output_split_sizes=None,  # noqa: A002
                          input_split_sizes=None, async_op: bool = False):
        """torch.distributed.all_to_all_single: input's rows go out in blocks, the k-th
        (input_split_sizes[k] rows, or an equal part) to rank k; output receives rank k's block
        for this rank as its k-th (output_split_sizes[k] rows). MPI's Alltoallv."""
        _, send, send_at, recv, recv_at = self._all_to_all_splits(output, input, output_split_sizes,
                                                                  input_split_sizes)
        (sbuf, kind), (rbuf, _) = _buffer(input), _buffer(output)
        src, dst = [sbuf, (send, send_at), kind], [rbuf, (recv, recv_at), kind]
        return self._collective(lambda: self.comm.Alltoallv(src, dst), lambda: self.comm.Ialltoallv(src, dst),
                                None, async_op, (output, input))

    @traced_collective(0)
    def isend(self, t: Tensor, dst: int, tag: int = 0) -> Work:
        return MPIWork([self.comm.Isend(_buffer(t), dest=dst, tag=tag)], keep=(t,))

    @traced_collective(0)
    def irecv(self, t: Tensor, src: int, tag: int = 0) -> Work:
        return MPIWork([self.comm.Irecv(_buffer(t), source=src, tag=tag)], keep=(t,))

    def send(self, t: Tensor, dst: int, tag: int = 0) -> None:
        self.isend(t, dst, tag).wait()

    def recv(self, t: Tensor, src: int, tag: int = 0) -> None:
        self.irecv(t, src, tag).wait()

    @traced_collective(None)
    def barrier(self) -> None:
        self._collective(self.comm.Barrier, self.comm.Ibarrier, None, async_op=False)


def nccl_unique_id(group_comm, make_id):
    """The NCCL bootstrap: rank 0 of the group makes the unique id (make_id() -> bytes) and
    mpi4py broadcasts it; every rank then creates its communicator from it."""
    uid = make_id() if group_comm.Get_rank() == 0 else None
    return group_comm.bcast(uid, root=0)

