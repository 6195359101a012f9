"""Every collective moves the version of the tensor it writes, as an in-place op does (the
process groups' traced_collective): autograd then refuses a tensor saved for backward that a
collective overwrote, and the offloaded optimizer's host masters see weights broadcast into the
parameters (tests/cuda/offload_broadcast.py). In process, on a group of one rank."""
import pytest

import infinitrain as it
from infinitrain.nn import parallel


@pytest.fixture(scope="module")
def group():
    from mpi4py import MPI
    return parallel.MPIProcessGroup(MPI.COMM_SELF, [0])


def _moves(t, write) -> bool:
    before = t._storage.version
    write()
    return t._storage.version > before


def test_each_collective_moves_the_version_of_what_it_writes_and_of_nothing_else(group):
    x, out, whole = it.arange(4.0), it.zeros(4), it.zeros(1, 4)
    assert _moves(x, lambda: group.all_reduce(x))
    assert _moves(x, lambda: group.all_reduce(x, async_op=True).wait())
    assert _moves(x, lambda: group.broadcast(x, 0))
    assert _moves(x, lambda: group.broadcast(x[2:], 0))  # a view: the storage it shares moves
    assert _moves(whole, lambda: group.all_gather(whole, x))
    assert _moves(out, lambda: group.reduce_scatter(out, whole))
    assert _moves(out, lambda: group.all_to_all_single(out, x))
    assert not any(_moves(t, write) for t, write in ((x, lambda: group.all_gather(whole, x)),
                                                 (whole, lambda: group.reduce_scatter(out, whole)),
                                                 (x, lambda: group.all_to_all_single(out, x))))
    got, sent = it.zeros(4), []
    assert not _moves(x, lambda: sent.append(group.isend(x, 0))) and _moves(got, lambda: group.recv(got, 0))
    sent[0].wait()
    assert got.tolist() == x.tolist()


def test_a_collective_into_a_tensor_saved_for_backward_is_an_error_at_backward(group):
    """PyTorch's c10d collectives move no version, and its backward computes with the
    overwritten values without a word; here backward says so."""
    w = it.randn(3, requires_grad=True)
    h = w * 2
    loss = (h * h).sum()  # saves h
    group.all_reduce(h.detach())
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
