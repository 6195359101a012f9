"""nn.RNN, LSTM, GRU and their cells against PyTorch's: torch's weights loaded through state_dict,
then outputs, final states and the gradients of the input, the initial state and every
parameter compared at fp32 1e-5."""
import numpy as np
import pytest

import infinitrain as it
from infinitrain import nn

torch = pytest.importorskip("torch")

TOL = dict(rtol=1e-5, atol=1e-5)


def _pair(cls, *args, **kwargs):
    theirs = getattr(torch.nn, cls)(*args, **kwargs)
    ours = getattr(nn, cls)(*args, **kwargs)
    state = theirs.state_dict()
    assert list(ours.state_dict()) == list(state)  # PyTorch's names, in PyTorch's order
    ours.load_state_dict({k: it.tensor(v.numpy()) for k, v in state.items()})
    return ours, theirs


def _leaf(a):
    return it.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)


def _flat(out):
    return [t for o in out for t in (_flat(o) if isinstance(o, tuple) else [o])] if isinstance(out, tuple) \
        else [out]


def _compare(ours, theirs, our_in, their_in, rng):
    """Forward and backward of both with the same upstream gradients; every result and gradient."""
    our_out, their_out = _flat(ours(*our_in)), _flat(theirs(*their_in))
    assert len(our_out) == len(their_out)
    our_loss, their_loss = 0, 0
    for a, b in zip(our_out, their_out):
        assert tuple(a.shape) == tuple(b.shape)
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), **TOL)
        w = rng.standard_normal(tuple(b.shape)).astype(np.float32)
        our_loss = our_loss + (a * it.tensor(w)).sum()
        their_loss = their_loss + (b * torch.tensor(w)).sum()
    our_loss.backward()
    their_loss.backward()
    for (name, p), (tname, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert name == tname
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), err_msg=name, **TOL)
    for a, b in zip(_flat(tuple(our_in)), _flat(tuple(their_in))):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), **TOL)


@pytest.mark.parametrize("cls,kwargs", [
    ("RNN", dict(num_layers=2)),
    ("RNN", dict(nonlinearity="relu", bias=False, batch_first=True)),
    ("LSTM", dict(num_layers=2, bidirectional=True)),
    ("LSTM", dict(batch_first=True)),
    ("GRU", dict(num_layers=2, bidirectional=True, batch_first=True)),
    ("GRU", dict(bias=False)),
])
def test_recurrent_layers_match_pytorch(cls, kwargs, rng):
    ours, theirs = _pair(cls, 5, 4, **kwargs)
    layers = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
    shape = (2, 3, 5)  # (L, N) or (N, L): the same numbers either way
    x = rng.standard_normal(shape).astype(np.float32)
    h = rng.standard_normal((layers, 2 if kwargs.get("batch_first") else 3, 4)).astype(np.float32)
    ox, tx = _leaf(x)
    oh, th = _leaf(h)
    if cls == "LSTM":
        oc, tc = _leaf(rng.standard_normal(h.shape).astype(np.float32))
        _compare(ours, theirs, (ox, (oh, oc)), (tx, (th, tc)), rng)
    else:
        _compare(ours, theirs, (ox, oh), (tx, th), rng)


@pytest.mark.parametrize("cls", ["RNN", "LSTM", "GRU"])
def test_unbatched_input_and_no_initial_state(cls, rng):
    ours, theirs = _pair(cls, 3, 2, bidirectional=True)
    ox, tx = _leaf(rng.standard_normal((4, 3)).astype(np.float32))
    _compare(ours, theirs, (ox,), (tx,), rng)


@pytest.mark.parametrize("cls", ["RNNCell", "LSTMCell", "GRUCell"])
def test_cells_match_pytorch(cls, rng):
    ours, theirs = _pair(cls, 5, 3)
    ox, tx = _leaf(rng.standard_normal((2, 5)).astype(np.float32))
    oh, th = _leaf(rng.standard_normal((2, 3)).astype(np.float32))
    if cls == "LSTMCell":
        oc, tc = _leaf(rng.standard_normal((2, 3)).astype(np.float32))
        _compare(ours, theirs, (ox, (oh, oc)), (tx, (th, tc)), rng)
    else:
        _compare(ours, theirs, (ox, oh), (tx, th), rng)
    ox, tx = _leaf(rng.standard_normal(5).astype(np.float32))  # unbatched, zero state
    a, b = _flat(ours(ox)), _flat(theirs(tx))
    for u, v in zip(a, b):
        np.testing.assert_allclose(u.detach().numpy(), v.detach().numpy(), **TOL)


def test_init_bounds_and_clear_refusals():
    lstm = nn.LSTM(3, 16)
    bound = 1 / 4
    for p in lstm.parameters():
        assert np.abs(p.detach().numpy()).max() <= bound
    assert tuple(lstm.weight_ih_l0.shape) == (64, 3)
    with pytest.raises(NotImplementedError, match="proj_size"):
        nn.LSTM(3, 4, proj_size=2)
    with pytest.raises(ValueError, match="nonlinearity"):
        nn.RNN(3, 4, nonlinearity="sigmoid")
    with pytest.raises(ValueError, match="initial state"):
        nn.GRU(3, 4)(it.zeros(2, 1, 3), it.zeros(2, 1, 4))
    with pytest.raises(ValueError, match="input"):
        nn.GRU(3, 4)(it.zeros(2, 1, 5))
