"""ProcessGroup: collectives over a set of ranks, each returning a Work.

Backend by device: CPU tensors go through MPI (mpi4py on the tensors' own memory, no copy,
non-blocking calls), CUDA tensors will go through NCCL (its unique id made on one rank and
broadcast with mpi4py; see `nccl_unique_id`). bfloat16 is not an MPI type: it is reduced
through a float32 copy, so sums are exact to float32 and rounded to bfloat16 once.
"""
from __future__ import annotations

from enum import Enum

from ...tensor import Tensor


class ReduceOp(Enum):
    SUM = "sum"
    AVG = "avg"
    MAX = "max"
    MIN = "min"


class Work:
    """A collective in flight: wait() blocks until it is done (then runs its epilogue, such as
    averaging or converting back from float32); is_completed() polls."""

    def __init__(self, requests=(), epilogue=None):
        self._requests = list(requests)
        self._epilogue = epilogue
        self._done = False

    def is_completed(self) -> bool:
        if self._done:
            return True
        from mpi4py import MPI
        if MPI.Request.Testall(self._requests):
            self._finish()
        return self._done

    def wait(self) -> None:
        if self._done:
            return
        from mpi4py import MPI
        MPI.Request.Waitall(self._requests)
        self._finish()

    def _finish(self) -> None:
        self._done = True
        if self._epilogue is not None:
            self._epilogue()
            self._epilogue = None


class ProcessGroup:
    """The backend-neutral interface; `ranks` are global ranks, `rank` this process's index."""

    ranks: list
    rank: int
    size: int

    def all_reduce(self, t: Tensor, op: ReduceOp = ReduceOp.SUM, async_op: bool = False): ...
    def all_gather(self, out: Tensor, t: Tensor, async_op: bool = False): ...
    def reduce_scatter(self, out: Tensor, t: Tensor, op: ReduceOp = ReduceOp.SUM, async_op: bool = False): ...
    def broadcast(self, t: Tensor, src: int = 0, async_op: bool = False): ...
    def send(self, t: Tensor, dst: int, tag: int = 0): ...
    def recv(self, t: Tensor, src: int, tag: int = 0): ...
    def isend(self, t: Tensor, dst: int, tag: int = 0) -> Work: ...
    def irecv(self, t: Tensor, src: int, tag: int = 0) -> Work: ...
    def barrier(self): ...


def _mpi_type(dtype):
    from mpi4py import MPI
    return {"float32": MPI.FLOAT, "float16": MPI.UINT16_T, "int32": MPI.INT32_T,
            "int64": MPI.INT64_T, "uint8": MPI.UINT8_T, "bfloat16": MPI.UINT16_T}[dtype.name]


def _mpi_op(op: ReduceOp):
    from mpi4py import MPI
    return {ReduceOp.SUM: MPI.SUM, ReduceOp.AVG: MPI.SUM, ReduceOp.MAX: MPI.MAX,
            ReduceOp.MIN: MPI.MIN}[op]


def _buffer(t: Tensor):
    from mpi4py import MPI
    if t.device.type != "cpu":
        raise ValueError(f"the MPI process group works on CPU tensors, this one is on {t.device}")
    if not t.is_contiguous():
        raise ValueError("collectives need contiguous tensors; call .contiguous() first")
    return [MPI.buffer.fromaddress(t.data_ptr(), t.nbytes), _mpi_type(t.dtype)]


class MPIProcessGroup(ProcessGroup):
    def __init__(self, comm, ranks):
        self.comm = comm
        self.ranks = list(ranks)
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()

    def __repr__(self) -> str:
        return f"MPIProcessGroup(ranks={self.ranks})"

    def _done(self, work: Work, async_op: bool):
        if async_op:
            return work
        work.wait()
        return None

    def all_reduce(self, t: Tensor, op: ReduceOp = ReduceOp.SUM, async_op: bool = False):
        from mpi4py import MPI
        op = ReduceOp(op)
        if t.dtype.name in ("bfloat16", "float16"):
            # not MPI types: reduce a float32 copy, write back once it is done
            wide = t.float()
            inner = self.all_reduce(wide, op, async_op=True)
            return self._done(Work(inner._requests, lambda: (inner._finish(), t.copy_(wide))), async_op)
        if op is ReduceOp.AVG and not t.dtype.is_floating_point:
            raise TypeError(f"all_reduce AVG of {t.dtype.name} tensors is not defined; use SUM")
        req = self.comm.Iallreduce(MPI.IN_PLACE, _buffer(t), op=_mpi_op(op))
        scale = 1.0 / self.size
        epilogue = (lambda: t.mul_(scale)) if op is ReduceOp.AVG and self.size > 1 else None
        return self._done(Work([req], epilogue), async_op)

    def all_gather(self, out: Tensor, t: Tensor, async_op: bool = False):
        """out [size * n, ...] = the ranks' t [n, ...] in rank order."""
        if out.numel() != t.numel() * self.size or out.dtype is not t.dtype:
            raise ValueError(f"all_gather: out must hold {self.size} x {tuple(t.shape)} "
                             f"{t.dtype.name}, got {tuple(out.shape)} {out.dtype.name}")
        req = self.comm.Iallgather(_buffer(t), _buffer(out))
        return self._done(Work([req]), async_op)

    def reduce_scatter(self, out: Tensor, t: Tensor, op: ReduceOp = ReduceOp.SUM,
                       async_op: bool = False):
        """out [n, ...] = this rank's block of the reduction of t [size * n, ...]."""
        if t.numel() != out.numel() * self.size or out.dtype is not t.dtype:
            raise ValueError(f"reduce_scatter: input must hold {self.size} x {tuple(out.shape)}, "
                             f"got {tuple(t.shape)}")
        op = ReduceOp(op)
        if t.dtype.name in ("bfloat16", "float16"):
            wide_in, wide_out = t.float(), out.float()
            inner = self.reduce_scatter(wide_out, wide_in, op, async_op=True)
            return self._done(Work(inner._requests, lambda: (inner._finish(), out.copy_(wide_out))), async_op)
        req = self.comm.Ireduce_scatter_block(_buffer(t), _buffer(out), op=_mpi_op(op))
        scale = 1.0 / self.size
        epilogue = (lambda: out.mul_(scale)) if op is ReduceOp.AVG and self.size > 1 else None
        return self._done(Work([req], epilogue), async_op)

    def broadcast(self, t: Tensor, src: int = 0, async_op: bool = False):
        """src is an index into this group's ranks."""
        req = self.comm.Ibcast(_buffer(t), root=src)
        return self._done(Work([req]), async_op)

    def isend(self, t: Tensor, dst: int, tag: int = 0) -> Work:
        return Work([self.comm.Isend(_buffer(t), dest=dst, tag=tag)])

    def irecv(self, t: Tensor, src: int, tag: int = 0) -> Work:
        return Work([self.comm.Irecv(_buffer(t), source=src, tag=tag)])

    def send(self, t: Tensor, dst: int, tag: int = 0) -> None:
        self.isend(t, dst, tag).wait()

    def recv(self, t: Tensor, src: int, tag: int = 0) -> None:
        self.irecv(t, src, tag).wait()

    def barrier(self) -> None:
        self.comm.Barrier()


def nccl_unique_id(group_comm, make_id):
    """The NCCL bootstrap: rank 0 of the group makes the unique id (make_id() -> bytes) and
    mpi4py broadcasts it; every rank then creates its communicator from it."""
    uid = make_id() if group_comm.Get_rank() == 0 else None
    return group_comm.bcast(uid, root=0)

