"""Tensor methods and functional options a PyTorch port uses at once (issue 28's list, a first
slice), held against PyTorch: sort/argsort, flip, roll, repeat, sign, nonzero, new_zeros/
new_ones/new_tensor, retain_grad, sum/softmax(dtype=), cross_entropy(label_smoothing=) and
embedding(padding_idx=), values and gradients."""
import numpy as np
import pytest

import infinitrain as it
import infinitrain.nn.functional as F

torch = pytest.importorskip("torch")


def _both(x):
    return it.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)


@pytest.mark.parametrize("name,ours,theirs", [
    ("sort", lambda t: t.sort(dim=1)[0], lambda t: t.sort(dim=1)[0]),
    ("sort_desc", lambda t: t.sort(dim=0, descending=True)[0], lambda t: t.sort(dim=0, descending=True)[0]),
    ("flip", lambda t: t.flip(0, 1), lambda t: t.flip((0, 1))),
    ("roll", lambda t: t.roll(2, 1), lambda t: t.roll(2, 1)),
    ("roll_flat", lambda t: t.roll(-3), lambda t: t.roll(-3)),
    ("repeat", lambda t: t.repeat(2, 1, 3), lambda t: t.repeat(2, 1, 3)),
    ("sum_dtype", lambda t: t.sum(dtype=it.float64), lambda t: t.sum(dtype=torch.float64)),
    ("softmax_dtype", lambda t: t.bfloat16().softmax(1, dtype=it.float32),
     lambda t: t.bfloat16().softmax(1, dtype=torch.float32)),  # a 16-bit input computed in float32
])
def test_methods_equal_pytorchs_with_gradients(name, ours, theirs, rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    a, b = _both(x)
    oa, ob = ours(a), theirs(b)
    np.testing.assert_allclose(oa.detach().numpy(), ob.detach().numpy(), rtol=1e-6, atol=1e-7)
    w = rng.standard_normal(tuple(ob.shape))
    (oa * it.tensor(w, dtype=oa.dtype)).sum().backward()
    (ob * torch.tensor(w, dtype=ob.dtype)).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_small_conveniences(rng):
    x = it.tensor([[0.0, -2.0, 3.0], [0.0, 0.0, -1.0]])
    assert x.sign().tolist() == [[0.0, -1.0, 1.0], [0.0, 0.0, -1.0]]
    assert x.nonzero().tolist() == [[0, 1], [0, 2], [1, 2]] and [t.tolist() for t in x.nonzero(as_tuple=True)] == \
        [[0, 0, 1], [1, 2, 2]]
    assert x.argsort(dim=1).tolist() == torch.tensor(x.tolist()).argsort(dim=1).tolist()
    z = x.new_zeros(2, 2)
    assert z.dtype is x.dtype and z.tolist() == [[0.0, 0.0], [0.0, 0.0]] and x.new_ones(3).tolist() == [1.0] * 3
    assert x.new_tensor([1, 2]).dtype is it.float32
    w = it.tensor([1.0, 2.0], requires_grad=True)
    h = w * 3
    h.retain_grad()
    (h * h).sum().backward()
    assert h.grad.tolist() == [6.0, 12.0] and w.grad.tolist() == [18.0, 36.0]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_label_smoothing_and_ignore_index_equals_pytorchs(reduction, rng):
    x = rng.standard_normal((6, 5)).astype(np.float32)
    t = np.array([1, 4, -100, 0, 2, 2])
    a, b = _both(x)
    la = F.cross_entropy(a, it.tensor(t), reduction=reduction, label_smoothing=0.1)
    lb = torch.nn.functional.cross_entropy(b, torch.tensor(t), reduction=reduction, label_smoothing=0.1)
    np.testing.assert_allclose(la.detach().numpy(), lb.detach().numpy(), rtol=1e-6, atol=1e-6)
    la.sum().backward()
    lb.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_embedding_padding_row_gets_no_gradient_as_pytorchs(rng):
    w = rng.standard_normal((7, 3)).astype(np.float32)
    ids = np.array([[1, 0, 3], [0, 6, 0]])
    a, b = _both(w)
    ea = F.embedding(it.tensor(ids), a, padding_idx=0)
    eb = torch.nn.functional.embedding(torch.tensor(ids), b, padding_idx=0)
    np.testing.assert_array_equal(ea.detach().numpy(), eb.detach().numpy())
    (ea * 2).sum().backward()
    (eb * 2).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), b.grad.numpy())
    assert not a.grad.numpy()[0].any()


INDEXES = ["v[v > 10]", "v[[1, 0]]", "v[:, [2, 0]]", "v[..., [3, 1]]", "v[0, [2]]", "v[:, 1:, [0, 2]]",
           "v[None, :, [1]]", "v[(v > 5)[:, :, 0]]", "v[1, (v > 14)[1]]", "v[torch_or_it.tensor([[1, 0], [0, 1]])]"]


@pytest.mark.parametrize("expr", INDEXES)
def test_advanced_indexing_reads_as_pytorchs_with_gradients(expr):
    """Bool masks, lists and index tensors on one dimension, among slices, ints, None and
    ..., forward and backward."""
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    a, b = _both(x)
    oa = eval(expr, {"v": a, "torch_or_it": it})
    ob = eval(expr, {"v": b, "torch_or_it": torch})
    np.testing.assert_array_equal(oa.detach().numpy(), ob.detach().numpy())
    (oa * oa).sum().backward()
    (ob * ob).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), b.grad.numpy())


@pytest.mark.parametrize("expr,value", [("v[v > 5]", 0.0), ("v[[2, 0]]", -1.0), ("v[:, [1, 3]]", 7.0),
                                        ("v[[0, 1]]", [[9.0] * 4, [8.0] * 4])])
def test_advanced_index_assignment_writes_as_pytorchs(expr, value):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a, b = it.tensor(x), torch.tensor(x)
    exec(f"{expr} = value", {"v": a, "value": it.tensor(value) if isinstance(value, list) else value})
    exec(f"{expr} = value", {"v": b, "value": torch.tensor(value) if isinstance(value, list) else value})
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_two_index_tensors_at_once_are_refused_with_a_way_out():
    with pytest.raises(NotImplementedError, match="index one dimension at a time"):
        it.tensor([[1.0, 2.0]])[[0], [1]]


def test_in_place_draws_and_maths_and_the_module_options():
    x = it.empty(4000).uniform_(-2.0, 3.0).numpy()
    assert x.min() >= -2.0 and x.max() <= 3.0 and abs(x.mean() - 0.5) < 0.1
    y = it.empty(4000).normal_(1.0, 0.5).numpy()
    assert abs(y.mean() - 1.0) < 0.05 and abs(y.std() - 0.5) < 0.05
    strided = it.zeros(4, 6)[:, ::2]
    strided.uniform_(1.0, 2.0)
    assert (strided.numpy() >= 1.0).all()
    z = it.tensor([1.0, 4.0])
    assert z.sqrt_().tolist() == [1.0, 2.0] and np.allclose(z.exp_().tolist(), np.exp([1.0, 2.0]))
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        it.zeros(2, requires_grad=True).uniform_()
    emb = it.nn.Embedding(5, 3, padding_idx=-1)
    assert emb.padding_idx == 4 and emb.weight[4].tolist() == [0.0, 0.0, 0.0]
    ours = it.nn.CrossEntropyLoss(label_smoothing=0.1)(it.tensor([[1.0, 2.0]]), it.tensor([1])).item()
    theirs = torch.nn.CrossEntropyLoss(label_smoothing=0.1)(torch.tensor([[1.0, 2.0]]), torch.tensor([1])).item()
    assert ours == pytest.approx(theirs, rel=1e-6)


def test_top_level_functions_equal_torchs(rng):
    """it.add/sub/mul/div/max/min/sort/argsort/split/chunk/flatten/squeeze/unsqueeze/transpose/
    permute/reshape/abs/tanh/sigmoid, as torch.* with the same arguments."""
    a = rng.standard_normal((3, 1, 4)).astype(np.float32)
    b = rng.standard_normal((3, 1, 4)).astype(np.float32)
    x, y, tx, ty = it.tensor(a), it.tensor(b), torch.tensor(a), torch.tensor(b)
    cases = [("add", (x, y), {"alpha": 2}), ("sub", (x, y), {"alpha": 0.5}), ("mul", (x, 3.0), {}),
             ("div", (x, y), {}), ("div", (x, 0.3), {"rounding_mode": "floor"}), ("max", (x,), {}),
             ("max", (x, 2), {"keepdim": True}), ("max", (x, y), {}), ("min", (x, 0), {}),
             ("sort", (x, 2), {"descending": True}), ("argsort", (x,), {}), ("split", (x, 3, 2), {}),
             ("chunk", (x, 2, 2), {}), ("flatten", (x, 1), {}), ("squeeze", (x,), {}), ("squeeze", (x, 1), {}),
             ("unsqueeze", (x, 0), {}), ("transpose", (x, 0, 2), {}), ("permute", (x, (2, 0, 1)), {}),
             ("reshape", (x, (4, 3)), {}), ("abs", (x,), {}), ("tanh", (x,), {}), ("sigmoid", (x,), {})]
    for name, args, kw in cases:
        targs = [ty if v is y else tx if v is x else v for v in args]
        ours, theirs = getattr(it, name)(*args, **kw), getattr(torch, name)(*targs, **kw)
        ours = ours if isinstance(ours, (tuple, list)) else (ours,)
        theirs = theirs if isinstance(theirs, (tuple, list)) else (theirs,)
        assert len(ours) == len(theirs), name
        for o, t in zip(ours, theirs):
            np.testing.assert_allclose(o.numpy(), t.numpy(), rtol=1e-6, err_msg=name)


EINSUMS = [("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ij,jk", [(3, 4), (4, 5)]),
           ("i,i->", [(5,), (5,)]), ("i,j->ij", [(3,), (4,)]), ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
           ("ij->ji", [(3, 4)]), ("ij->", [(3, 4)]), ("ijk->j", [(2, 3, 4)]), ("ij", [(3, 4)]), ("ji", [(3, 4)]),
           ("...ij,...jk->...ik", [(2, 3, 4, 5), (3, 5, 2)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
           ("abc,cd,ae->bde", [(2, 3, 4), (4, 5), (2, 6)]), ("i...,i->...", [(3, 2, 2), (3,)]),
           ("ij,ij->ij", [(3, 1), (1, 4)]), ("b i d, b j d -> b i j", [(2, 3, 4), (2, 5, 4)])]


@pytest.mark.parametrize("equation,shapes", EINSUMS, ids=[e for e, _ in EINSUMS])
def test_einsum_equals_torchs_with_gradients(equation, shapes, rng):
    """Explicit and implicit outputs, '...', sums, outer products, chains of three, broadcast
    letters of size 1: values and every operand's gradient as torch.einsum's."""
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    ours, theirs = zip(*(_both(a) for a in arrays))
    got, want = it.einsum(equation, *ours), torch.einsum(equation, *theirs)
    weight = rng.standard_normal(tuple(want.shape)).astype(np.float32)
    (got * it.tensor(weight)).sum().backward()
    (want * torch.tensor(weight)).sum().backward()
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-5)
    assert tuple(it.einsum(equation, list(ours)).shape) == tuple(want.shape)  # operands as one list


@pytest.mark.parametrize("equation,shapes,error,message", [
    ("ij,jk->ik", [(3, 4), (5, 6)], ValueError, "subscript 'j' has size 4 in one operand and 5"),
    ("ij,jk->ik", [(3, 4)], ValueError, "1 tensor"),
    ("ijk->ik", [(3, 4)], ValueError, "names 3 dimension"),
    ("ij->iz", [(3, 4)], ValueError, "in no operand"),
    ("i1->i", [(3, 4)], ValueError, "is not a subscript"),
    ("ii->i", [(3, 3)], NotImplementedError, "a diagonal"),
])
def test_einsum_errors_say_what_is_wrong(equation, shapes, error, message):
    with pytest.raises(error, match=message):
        it.einsum(equation, *[it.zeros(*s) for s in shapes])
