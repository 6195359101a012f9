"""The NCCL backend of ProcessGroup, for CUDA tensors: libinfinitrain's communicator (it_comm_*,
NCCL inside the CUDA library), bootstrapped through MPI: the group's first rank makes the
unique id and mpi4py broadcasts it (`mpi.nccl_unique_id`).

Every collective runs on the group's communication stream. It first waits for an event
recorded on the caller's current stream (the tensors are ready there), queues the NCCL call,
and records its own event. Work.wait() makes the caller's current stream wait for that event:
the host does not block, the compute kernels queued after it do (as torch.distributed with
NCCL). is_completed() asks the event. A Work keeps its tensors alive until it has been waited
for, so that memory the communication stream still reads is not reused. bfloat16 is reduced by
NCCL natively.
"""
from __future__ import annotations

from ... import cuda
from ..._native import check, ffi, lib
from ...tensor import Tensor
from .mpi import nccl_unique_id
from .process_group import ProcessGroup, ReduceOp, Work, traced_collective

_OPS = {ReduceOp.SUM: lib.IT_COMM_SUM, ReduceOp.AVG: lib.IT_COMM_AVG, ReduceOp.MAX: lib.IT_COMM_MAX,
        ReduceOp.MIN: lib.IT_COMM_MIN}


def _native_op(op) -> int:
    """The communicator's code for op, or an error naming the ops it has."""
    op = ReduceOp(op)
    if op not in _OPS:
        raise ValueError(f"the NCCL process group reduces with {', '.join(o.name for o in _OPS)}, not {op.name}")
    return _OPS[op]


class NCCLWork(Work):
    def __init__(self, done: cuda.Event, keep: tuple):
        super().__init__(keep=keep)
        self._event = done

    def _test(self) -> bool:
        return self._event.query()

    def _block(self) -> None:
        self._event.wait()  # the caller's current stream waits; the host goes on

    @property
    def event(self) -> cuda.Event:
        """Marks the operation done on the device: another stream can wait for it
        (stream.wait_event) without the host waiting, or the current stream with wait()."""
        return self._event


class NCCLProcessGroup(ProcessGroup):
    waits_on_host = False

    def __init__(self, comm, ranks, device):
        self.comm, self.ranks = comm, list(ranks)  # comm: the group's MPI communicator (bootstrap)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.device = device
        uid = nccl_unique_id(comm, self._make_id)
        out = ffi.new("it_comm **")
        check(lib.it_comm_init(device.native, uid, len(uid), self.size, self.rank, out))
        self._comm = ffi.gc(out[0], lib.it_comm_destroy)
        self.stream = cuda.Stream(device)
        self._links = {}  # (from, to, tag) -> the two-rank group of that directed link
        self._opened = set()  # every link made so far, known to every rank of the group

    def open_p2p_links(self, links) -> None:
        """NCCL has no tags, and one communicator runs its operations one after another on one
        stream, where a send waits for its receive: each directed link (from, to, tag) gets a
        two-rank communicator and stream of its own, so that a link's messages pair in the
        order they were sent and one link never waits behind another. Collective over the
        group; the links are made in one order on every rank, each once (a link already open
        is kept: the pipeline and context parallelism may ask for the same group's links)."""
        from mpi4py import MPI
        for src, dst, tag in sorted(set(links) - self._opened):
            if not (0 <= src < self.size and 0 <= dst < self.size and src != dst):
                raise ValueError(f"a link joins two different ranks of the group (0..{self.size - 1}), "
                                 f"got {src} -> {dst}")
            inside = self.rank in (src, dst)
            sub = self.comm.Split(0 if inside else MPI.UNDEFINED, 0 if self.rank == src else 1)
            if inside:
                self._links[(src, dst, tag)] = NCCLProcessGroup(sub, [self.ranks[src], self.ranks[dst]],
                                                                self.device)
            self._opened.add((src, dst, tag))

    def _make_id(self) -> bytes:
        buf = ffi.new("uint8_t[128]")
        check(lib.it_comm_unique_id(self.device.native, buf, 128))
        return bytes(ffi.buffer(buf))

    def __repr__(self) -> str:
        return f"NCCLProcessGroup(ranks={self.ranks}, {self.device})"

    def _subgroup(self, comm, members: list) -> "NCCLProcessGroup":
        return NCCLProcessGroup(comm, members, self.device)

    def _check(self, *tensors: Tensor) -> None:
        for t in tensors:
            if t.device != self.device:
                raise ValueError(f"the NCCL process group of {self.device} got a tensor on {t.device}")
            if not t.is_contiguous():
                raise ValueError("collectives need contiguous tensors; call .contiguous() first")

    def _run(self, launch, keep: tuple, async_op: bool):
        """launch(stream handle) queues the NCCL call on the communication stream, after the
        work the caller's stream has queued so far."""
        ready = cuda.Event(self.device)
        ready.record()  # the caller's current stream
        self.stream.wait_event(ready)
        launch(self.stream._handle)
        return self._done(NCCLWork(self.stream.record_event(), keep), async_op)

    @traced_collective(0)
    def all_reduce(self, t: Tensor, op: ReduceOp = ReduceOp.SUM, async_op: bool = False):
        self._check(t)
        code = _native_op(op)
        if ReduceOp(op) is ReduceOp.AVG and not t.dtype.is_floating_point:
            raise TypeError(f"all_reduce AVG of {t.dtype.name} tensors is not defined; use SUM")
        return self._run(lambda s: check(lib.it_comm_all_reduce(self._comm, t.dtype.native, t._ptr(), t._ptr(),
                                                                t.numel(), code, s)), (t,), async_op)

    @traced_collective(0)
    def all_gather(self, out: Tensor, t: Tensor, async_op: bool = False):
        self._check(out, t)
        self._check_gathered("all_gather", out, t)
        return self._run(lambda s: check(lib.it_comm_all_gather(self._comm, t.dtype.native, t._ptr(), out._ptr(),
                                                                t.numel(), s)), (out, t), async_op)

    @traced_collective(1)
    def reduce_scatter(self, out: Tensor, t: Tensor, op: ReduceOp = ReduceOp.SUM, async_op: bool = False):
        self._check(out, t)
        self._check_gathered("reduce_scatter", t, out)
        code = _native_op(op)
        return self._run(lambda s: check(lib.it_comm_reduce_scatter(self._comm, t.dtype.native, t._ptr(),
                                                                    out._ptr(), out.numel(), code, s)),
                         (out, t), async_op)

    @traced_collective(0)
    def broadcast(self, t: Tensor, src: int = 0, async_op: bool = False):
        self._check(t)
        return self._run(lambda s: check(lib.it_comm_broadcast(self._comm, t.dtype.native, t._ptr(), t._ptr(),
                                                               t.numel(), src, s)), (t,), async_op)

    @traced_collective(1)
    def all_to_all_single(self, output: Tensor, input: Tensor, output_split_sizes=None,  # noqa: A002
                          input_split_sizes=None, async_op: bool = False):
        """torch.distributed.all_to_all_single (mpi.py's contract): NCCL sends and receives in one
        group."""
        self._check(output, input)
        _, send, send_at, recv, recv_at = self._all_to_all_splits(output, input, output_split_sizes,
                                                                  input_split_sizes)
        arrays = [ffi.new("int64_t[]", v) for v in (send, send_at, recv, recv_at)]
        return self._run(lambda s: check(lib.it_comm_all_to_all(
            self._comm, input.dtype.native, input._ptr(), input.numel(), arrays[0], arrays[1], output._ptr(),
            output.numel(), arrays[2], arrays[3], s)), (output, input), async_op)

    @traced_collective(0)
    def isend(self, t: Tensor, dst: int, tag: int = 0) -> Work:
        """Messages to a rank pair in the order they were sent; a tag names a link opened with
        open_p2p_links (its own communicator), or is 0."""
        link = self._link(self.rank, dst, tag)
        return link._send(t, 1) if link is not None else self._send(t, dst)

    @traced_collective(0)
    def irecv(self, t: Tensor, src: int, tag: int = 0) -> Work:
        link = self._link(src, self.rank, tag)
        return link._recv(t, 0) if link is not None else self._recv(t, src)

    def _link(self, src: int, dst: int, tag: int):
        link = self._links.get((src, dst, tag))
        if link is None and (tag != 0 or self._links):
            raise ValueError(f"NCCL has no tags: open the link {src} -> {dst} with tag {tag} first "
                             "(open_p2p_links, on every rank of the group)")
        return link

    def _send(self, t: Tensor, peer: int) -> Work:
        self._check(t)
        return self._run(lambda s: check(lib.it_comm_send(self._comm, t.dtype.native, t._ptr(), t.numel(),
                                                          peer, s)), (t,), True)

    def _recv(self, t: Tensor, peer: int) -> Work:
        self._check(t)
        return self._run(lambda s: check(lib.it_comm_recv(self._comm, t.dtype.native, t._ptr(), t.numel(),
                                                          peer, s)), (t,), True)

    def send(self, t: Tensor, dst: int, tag: int = 0) -> None:
        self.isend(t, dst, tag).wait()

    def recv(self, t: Tensor, src: int, tag: int = 0) -> None:
        self.irecv(t, src, tag).wait()

    def barrier(self) -> None:
        """Every rank's host waits for every other's: the MPI communicator's barrier, after this
        device's queued work."""
        cuda.synchronize(self.device)
        self.comm.Barrier()
