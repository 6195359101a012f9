"""In-place operations under autograd, against PyTorch: recorded writes on activations, the
version counter that refuses a saved tensor changed before backward, the leaf and view rules,
the shape and dtype checks of in-place writes, scatter / scatter_add / index_add."""
import numpy as np
import pytest

import infinitrain as it

torch = pytest.importorskip("torch")
TOL = dict(rtol=1e-5, atol=1e-5)
R = np.random.default_rng(7)


def pair(*shape, positive=False):
    a = R.standard_normal(shape).astype(np.float32)
    a = np.abs(a) + 0.5 if positive else a
    return it.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)


def close(ours, theirs):
    np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), **TOL)


# each program: fn(module, a, b) with a, b leaves that require grad; the result's gradients are compared
PROGRAMS = {
    "add_": lambda m, a, b: (a * 2).add_(b, alpha=0.5),
    "iadd_residual": lambda m, a, b: _iadd(a * 2 + 1, b),
    "sub_mul_div_": lambda m, a, b: (a * 1).sub_(b).mul_(b).div_(b.abs() + 1).mul_(3.0),
    "relu_clamp_": lambda m, a, b: (a + b).clamp_(-0.5, 0.9).relu_(),
    "exp_sqrt_": lambda m, a, b: (a * 0.1).exp_() * b + (a.abs() + 0.5).sqrt_(),
    "masked_fill_": lambda m, a, b: (a * b).masked_fill_(a.detach() > 0, 0.5),
    "copy_": lambda m, a, b: (a * 2).copy_(b) * a,
    "zero_then_add": lambda m, a, b: (a * 2).zero_().add_(b),
    "setitem": lambda m, a, b: _setitem(m, a, b),
    "mul_twice_used": lambda m, a, b: _twice(a, b),
}


def _iadd(out, shortcut):
    out += shortcut
    return out


def _setitem(m, a, b):
    out = m.zeros(4, 3)
    out[1:3] = a * 2
    out[0, 1:] = b[0, :2]
    return out


def _twice(a, b):
    h = a * b
    y = h.sum()
    h.mul_(2)  # h is not saved by anything: its old value's gradient still flows
    return h * 1 + y


def _view_write(m, a, b):
    x = a * 1
    v = x[0:2]
    v.mul_(3)  # re-bases x
    return x * 1 + v.sum()


def _views_of_views(m, a, b):
    x = a * b
    y = x.view(-1)
    y.add_(b.reshape(-1))
    y[2:5].mul_(a.reshape(-1)[2:5])
    row = x[1]
    row[1:].sub_(b[0, 1:])  # row, made before, is brought up to date when used below
    return x.exp() + row.sum() + x.t()[1].relu_().sum()


def _residual_block(m, a, b):
    out = a * b + 1  # a layer's output
    out += a  # the shortcut
    return m.nn.ReLU(inplace=True)(out) * m.nn.functional.relu(b - 1, inplace=False)


PROGRAMS.update({"residual_block": _residual_block, "view_write": _view_write, "views_of_views": _views_of_views,
                 "iadd_into_slice": lambda m, a, b: _iadd_slice(a * 2, b)})


def _iadd_slice(x, b):
    x[:, 0] += b[:, 1]
    return x


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_inplace_ops_record_values_and_gradients_as_pytorch(name):
    shape = (4, 3) if name != "setitem" else (2, 3)
    a, ta = pair(*shape)
    b, tb = pair(*shape, positive=True)
    if name == "setitem":
        b, tb = pair(4, 3)
    out, tout = PROGRAMS[name](it, a, b), PROGRAMS[name](torch, ta, tb)
    close(out, tout)
    g = R.standard_normal(tuple(tout.shape)).astype(np.float32)
    out.backward(it.tensor(g))
    tout.backward(torch.tensor(g))
    close(a.grad, ta.grad)
    assert (b.grad is None) == (tb.grad is None)
    if tb.grad is not None:
        close(b.grad, tb.grad)


def test_a_saved_tensor_changed_before_backward_is_refused():
    a, _ = pair(3)
    w, _ = pair(3)
    x = a * 1
    y = x * w  # saves x
    x.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation.*version 1; expected version 0"):
        y.sum().backward()
    x = a * 1
    y = x * w
    x.detach()[0] = 5.0  # through .detach() (issue 50): the storage's version is shared
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    x = a * 1
    y = x * w
    with it.no_grad():
        x.mul_(2)  # no_grad writes still count
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_leaf_view_and_raw_view_rules():
    a, _ = pair(3)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
        a.add_(1)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        a[0] = 1.0
    with it.no_grad():  # optimizers' writes stay allowed
        a.add_(1).mul_(0.5)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad"):
        a[0:2].mul_(3)
    buf = it.zeros(2, 3)
    with pytest.raises(RuntimeError, match="view of a tensor that does not require grad"):
        buf[0].copy_(a)
    buf[0] = a  # on the base: recorded
    buf.sum().backward()
    assert a.grad.tolist() == [1.0, 1.0, 1.0]


def test_inplace_shape_and_dtype_checks_match_pytorch():
    cases = [lambda m: m.zeros(3).add_(m.ones(2, 3)), lambda m: m.zeros(()).copy_(m.ones(1)),
             lambda m: m.zeros(3).copy_(m.ones(2, 3)), lambda m: m.zeros(1).mul_(m.ones(1, 1)),
             lambda m: m.zeros(3, dtype=m.int64).add_(0.5)]
    for case in cases:
        with pytest.raises(RuntimeError) as theirs:
            case(torch)
        message = str(theirs.value)
        if "can't be cast" in message:  # PyTorch's dtype names differ (Float, Long)
            message = "result type .* can't be cast to the desired output type"
        with pytest.raises(RuntimeError, match=message.replace("[", r"\[").replace("]", r"\]")):
            case(it)
    x = it.zeros(2, 3)
    x.copy_(it.ones(3))
    x.add_(it.ones(1, 3))
    assert x.tolist() == [[2.0] * 3] * 2


INDEX = np.array([[0, 2, 1], [2, 0, 0]])


@pytest.mark.parametrize("op", ["scatter", "scatter_add", "index_add", "scatter_value"])
def test_scatter_and_index_add_values_and_gradients(op):
    a, ta = pair(3, 4)
    s, ts = pair(2, 3)
    idx = it.tensor(INDEX)
    tidx = torch.tensor(INDEX)
    if op == "scatter":
        out, tout = (a * 1).scatter_(0, idx, s), (ta * 1).scatter_(0, tidx, ts)
    elif op == "scatter_value":
        out, tout = a.scatter(1, idx[:, :2], value=2.5), ta.scatter(1, tidx[:, :2], value=2.5)
    elif op == "scatter_add":
        out, tout = it.scatter_add(a, 0, idx, s), torch.scatter_add(ta, 0, tidx, ts)
    else:
        s, ts = pair(5, 4)
        i5 = np.array([2, 0, 2, 1, 0])
        out = (a * 1).index_add_(0, it.tensor(i5), s, alpha=2.0)
        tout = (ta * 1).index_add_(0, torch.tensor(i5), ts, alpha=2.0)
    close(out, tout)
    g = R.standard_normal((3, 4)).astype(np.float32)
    out.backward(it.tensor(g))
    tout.backward(torch.tensor(g))
    close(a.grad, ta.grad)
    if op != "scatter_value":
        close(s.grad, ts.grad)


def test_scatter_checks_and_duplicates():
    x = it.zeros(3, 4)
    with pytest.raises(RuntimeError, match="Expected dtype int32/int64 for index"):
        x.scatter_(0, it.tensor([[0.0]]), it.ones(1, 1))
    with pytest.raises(RuntimeError, match="same number of dimensions"):
        x.scatter_(0, it.tensor([0]), it.ones(3, 4))
    with pytest.raises(RuntimeError, match="to be no larger than self"):
        x.scatter_(0, it.zeros(2, 5, dtype=it.int64), it.ones(3, 4))
    with pytest.raises(RuntimeError, match="Expected self.dtype to be equal to src.dtype"):
        x.scatter_(0, it.zeros(1, 1, dtype=it.int64), it.ones(1, 1, dtype=it.float64))
    with pytest.raises(Exception, match="out of range"):
        x.scatter_(0, it.tensor([[5]]), it.ones(1, 1))
    with pytest.raises(Exception, match="out of range"):
        x.index_add_(0, it.tensor([5]), it.ones(1, 4))
    with pytest.raises(RuntimeError, match="Number of indices"):
        x.index_add_(0, it.tensor([0]), it.ones(2, 4))
    # src larger than the index: its corner is used
    src = R.standard_normal((3, 5)).astype(np.float32)
    got = it.zeros(3, 4).scatter_add(0, it.tensor(INDEX), it.tensor(src))
    want = torch.zeros(3, 4).scatter_add(0, torch.tensor(INDEX), torch.tensor(src))
    np.testing.assert_allclose(got.numpy(), want.numpy(), **TOL)
    got = it.zeros(3, 4).scatter(0, it.tensor(INDEX), it.tensor(src))
    np.testing.assert_allclose(got.numpy(), torch.zeros(3, 4).scatter(0, torch.tensor(INDEX), torch.tensor(src)), **TOL)
    # two writes to one place: the last one wins, as on PyTorch's CPU
    got = it.zeros(3).scatter(0, it.tensor([1, 1]), it.tensor([2.0, 3.0]))
    assert got.tolist() == torch.zeros(3).scatter(0, torch.tensor([1, 1]), torch.tensor([2.0, 3.0])).tolist()


@pytest.mark.parametrize("call", [
    lambda m: m.zeros(3).scatter(0, m.tensor([-1]), m.ones(1)),
    lambda m: m.zeros(3).scatter_add(0, m.tensor([-2]), m.ones(1)),
    lambda m: m.zeros(3).index_add(0, m.tensor([-1]), m.ones(1)),
])
def test_a_negative_index_is_out_of_bounds_as_in_pytorch(call):
    """The native kernels wrapped -1 to the last row: PyTorch refuses it."""
    with pytest.raises(RuntimeError, match="out of bounds|out of range"):
        call(it)
    torch = pytest.importorskip("torch")
    with pytest.raises((RuntimeError, IndexError)):
        call(torch)
