"""torch.distributed's collectives over the backends' own (MPIProcessGroup, NCCLProcessGroup):
each names its group (None: the default), takes ranks as global ranks (group_src/group_dst: as
ranks inside the group), and with async_op=True returns a Work whose wait() finishes it. The
ones the backends lack are made of theirs: reduce of all_reduce, gather of all_gather, scatter
of broadcast, the list forms through one flat buffer. A rank outside the group does nothing
(PyTorch's rule for GroupMember.NON_GROUP_MEMBER)."""
from __future__ import annotations

from ..autograd import no_grad
from ..creation import empty
from ..nn.parallel.process_group import ReduceOp as _Op
from ..nn.parallel.process_group import Work, _then
from ..tensor import Tensor
from .groups import _host_collective, _resolve

_UNSUPPORTED_OPS = ("BAND", "BOR", "BXOR", "PREMUL_SUM")


class _ReduceOpType(type):
    def __getattr__(cls, name):
        if name in _UNSUPPORTED_OPS:
            raise AttributeError(f"ReduceOp.{name} is not supported by infinitrain's collectives: they reduce "
                                 "with SUM, AVG, PRODUCT (the MPI backend), MIN and MAX")
        raise AttributeError(f"type object 'ReduceOp' has no attribute {name!r}")


class ReduceOp(metaclass=_ReduceOpType):
    """torch.distributed.ReduceOp: the backends' own ops (nn.parallel.ReduceOp) under PyTorch's
    names. PRODUCT runs on the MPI backend only (the NCCL one says so)."""

    SUM = _Op.SUM
    AVG = _Op.AVG
    PRODUCT = _Op.PRODUCT
    MIN = _Op.MIN
    MAX = _Op.MAX
    RedOpType = _Op


def _op(op) -> _Op:
    if isinstance(op, _Op):
        return op
    raise TypeError(f"op must be a ReduceOp (SUM, AVG, PRODUCT, MIN, MAX), got {op!r}")


def _tensor(t, what: str) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{what} must be an infinitrain Tensor, got {type(t).__name__}")
    return t


def _index(g, rank, group_rank, what: str) -> int:
    """The index inside g of a global rank (or of group_rank, given as an index already)."""
    if group_rank is not None:
        if rank is not None:
            raise ValueError(f"give {what} or group_{what}, not both")
        if not 0 <= group_rank < g.size:
            raise ValueError(f"group_{what} {group_rank} is not a rank of the group (0..{g.size - 1})")
        return group_rank
    rank = 0 if rank is None else rank
    if rank not in g.ranks:
        raise ValueError(f"{what} {rank} is not in the group (global ranks {g.ranks})")
    return g.ranks.index(rank)


def _finish(work, epilogue, async_op: bool):
    """What a composed collective returns: the backend's Work followed by epilogue (waited for
    here unless async_op)."""
    then = _then(work, lambda: _quietly(epilogue))
    if async_op:
        return then
    then.wait()
    return None


def _quietly(fn) -> None:
    with no_grad():  # results land as data, as PyTorch's collectives write them
        fn()


def _pieces(flat: Tensor, like: Tensor, n: int):
    return [flat[i * like.numel():(i + 1) * like.numel()].view(*like.shape) for i in range(n)]


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """tensor, in place, becomes the reduction of every rank's tensor."""
    g = _resolve(group)
    if g is None:
        return None
    with no_grad():
        return g.all_reduce(_tensor(tensor, "all_reduce's tensor"), _op(op), async_op=async_op)


def broadcast(tensor, src=None, group=None, async_op: bool = False, group_src=None):
    """tensor, in place, becomes rank src's tensor."""
    g = _resolve(group)
    if g is None:
        return None
    return g.broadcast(_tensor(tensor, "broadcast's tensor"), _index(g, src, group_src, "src"), async_op=async_op)


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op: bool = False, group_dst=None):
    """Rank dst's tensor becomes the reduction; the others' are left as they were."""
    g = _resolve(group)
    if g is None:
        return None
    _tensor(tensor, "reduce's tensor")
    mine = _index(g, dst, group_dst, "dst") == g.rank
    with no_grad():
        return g.all_reduce(tensor if mine else tensor.clone(), _op(op), async_op=async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False):
    """output_tensor holds every rank's input_tensor in rank order ([size * n, ...] or
    [size, n, ...])."""
    g = _resolve(group)
    if g is None:
        return None
    return g.all_gather(_tensor(output_tensor, "output_tensor"), _tensor(input_tensor, "input_tensor"),
                        async_op=async_op)


def _gathered(g, tensor):
    """(flat buffer for every rank's tensor, the backend's Work or None): an all_gather."""
    _tensor(tensor, "tensor")
    flat = empty(g.size * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    return flat, g.all_gather(flat, tensor.contiguous().view(-1), async_op=True)


def _check_list(tensors, like, n: int, what: str) -> None:
    if not isinstance(tensors, (list, tuple)) or len(tensors) != n:
        raise ValueError(f"{what} must be a list of {n} tensors (one per rank of the group)")
    for t in tensors:
        _tensor(t, f"each of {what}")
        if tuple(t.shape) != tuple(like.shape) or t.dtype is not like.dtype:
            raise ValueError(f"{what}: each tensor must be {tuple(like.shape)} {like.dtype.name}, "
                             f"got {tuple(t.shape)} {t.dtype.name}")


def all_gather(tensor_list, tensor, group=None, async_op: bool = False):
    """tensor_list[i] becomes rank i's tensor."""
    g = _resolve(group)
    if g is None:
        return None
    _check_list(tensor_list, _tensor(tensor, "all_gather's tensor"), g.size, "tensor_list")
    flat, work = _gathered(g, tensor)

    def scatter_back():
        for dst, piece in zip(tensor_list, _pieces(flat, tensor, g.size)):
            dst.copy_(piece)
    return _finish(work, scatter_back, async_op)


def gather(tensor, gather_list=None, dst=None, group=None, async_op: bool = False, group_dst=None):
    """On rank dst, gather_list[i] becomes rank i's tensor (the other ranks pass none). Built on
    all_gather: every rank receives world_size tensors, not only dst (the results are PyTorch's)."""
    g = _resolve(group)
    if g is None:
        return None
    mine = _index(g, dst, group_dst, "dst") == g.rank
    if mine:
        _check_list(gather_list, _tensor(tensor, "gather's tensor"), g.size, "gather_list")
    elif gather_list:
        raise ValueError("gather: gather_list is given on the destination rank only")
    flat, work = _gathered(g, tensor)

    def keep():
        if mine:
            for out, piece in zip(gather_list, _pieces(flat, tensor, g.size)):
                out.copy_(piece)
    return _finish(work, keep, async_op)


def scatter(tensor, scatter_list=None, src=None, group=None, async_op: bool = False, group_src=None):
    """tensor becomes scatter_list[r] of rank src (on rank r); the other ranks pass no list.
    Built on broadcast: every rank receives the whole list, not only its piece."""
    g = _resolve(group)
    if g is None:
        return None
    index = _index(g, src, group_src, "src")
    _tensor(tensor, "scatter's tensor")
    n = tensor.numel()
    if index == g.rank:
        _check_list(scatter_list, tensor, g.size, "scatter_list")
        flat = empty(g.size * n, dtype=tensor.dtype, device=tensor.device)
        with no_grad():
            for piece, t in zip(_pieces(flat, tensor, g.size), scatter_list):
                piece.copy_(t)
    elif scatter_list:
        raise ValueError("scatter: scatter_list is given on the source rank only")
    else:
        flat = empty(g.size * n, dtype=tensor.dtype, device=tensor.device)
    work = g.broadcast(flat, index, async_op=True)
    return _finish(work, lambda: tensor.copy_(flat[g.rank * n:(g.rank + 1) * n].view(*tensor.shape)), async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op: bool = False):  # noqa: A002
    """output becomes this rank's block of the reduction of every rank's input ([size * n, ...])."""
    g = _resolve(group)
    if g is None:
        return None
    with no_grad():
        return g.reduce_scatter(_tensor(output, "output"), _tensor(input, "input"), _op(op), async_op=async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """output becomes the reduction of every rank's input_list[this rank]."""
    g = _resolve(group)
    if g is None:
        return None
    _check_list(input_list, _tensor(output, "output"), g.size, "input_list")
    flat = empty(g.size * output.numel(), dtype=output.dtype, device=output.device)
    with no_grad():
        for piece, t in zip(_pieces(flat, output, g.size), input_list):
            piece.copy_(t)
        return g.reduce_scatter(output, flat.view(g.size, *output.shape), _op(op), async_op=async_op)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,  # noqa: A002
                      async_op: bool = False):
    """input's rows (first dimension) go out in blocks, input_split_sizes[k] (None: an equal
    part) to rank k; output receives output_split_sizes[k] rows from rank k, in rank order."""
    g = _resolve(group)
    if g is None:
        return None
    with no_grad():
        return g.all_to_all_single(_tensor(output, "output"), _tensor(input, "input"), output_split_sizes,
                                   input_split_sizes, async_op=async_op)


def barrier(group=None, async_op: bool = False, device_ids=None, timeout=None):
    """Returns once every rank of the group has reached it (async_op: a Work already done)."""
    g = _resolve(group)
    if g is None:
        return None
    g.barrier()
    return Work() if async_op else None


def send(tensor, dst=None, group=None, tag: int = 0, group_dst=None) -> None:
    g = _resolve(group)
    if g is not None:
        g.send(_tensor(tensor, "send's tensor"), _index(g, dst, group_dst, "dst"), tag)


def recv(tensor, src=None, group=None, tag: int = 0, group_src=None) -> int:
    """Returns the sender's rank. src is required: a receive from any rank is not supported."""
    g = _resolve(group)
    if g is None:
        return -1
    if src is None and group_src is None:
        raise ValueError("recv: name src (a receive from any rank is not supported)")
    index = _index(g, src, group_src, "src")
    g.recv(_tensor(tensor, "recv's tensor"), index, tag)
    return g.ranks[index] if group_src is None else index


def isend(tensor, dst=None, group=None, tag: int = 0, group_dst=None):
    g = _resolve(group)
    return None if g is None else g.isend(_tensor(tensor, "isend's tensor"), _index(g, dst, group_dst, "dst"), tag)


def irecv(tensor, src=None, group=None, tag: int = 0, group_src=None):
    g = _resolve(group)
    if g is None:
        return None
    if src is None and group_src is None:
        raise ValueError("irecv: name src (a receive from any rank is not supported)")
    return g.irecv(_tensor(tensor, "irecv's tensor"), _index(g, src, group_src, "src"), tag)


def all_gather_object(object_list, obj, group=None) -> None:
    """object_list[i] becomes rank i's obj (picklable objects)."""
    g = _resolve(group)
    if g is None:
        return
    if len(object_list) != g.size:
        raise ValueError(f"all_gather_object: object_list must have {g.size} entries (one per rank)")
    object_list[:] = _host_collective(g, lambda comm: comm.allgather(obj))


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None) -> None:
    """object_list's entries become rank src's (picklable objects), in place."""
    g = _resolve(group)
    if g is None:
        return
    index = _index(g, src, group_src, "src")
    got = _host_collective(g, lambda comm: comm.bcast(list(object_list) if g.rank == index else None, root=index))
    if len(got) != len(object_list):
        raise ValueError(f"broadcast_object_list: rank {g.ranks[index]} sent {len(got)} objects, this rank's list "
                         f"has room for {len(object_list)}")
    object_list[:] = got
