"""Regressions for the semantic bugs a differential test against PyTorch found, and the
PyTorch API added with them (each one a case that once gave a silent wrong result or raised)."""
import numpy as np
import pytest

import infinitrain as it
import infinitrain.nn.functional as F

def _num_grad(f, x, eps=1e-6):
    """Central differences of scalar f at float64 array x."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        g[i] = (f(xp) - f(xm)) / (2 * eps)
    return g


def test_cross_entropy_twice_with_retain_graph():
    x = it.randn(4, 7, requires_grad=True)
    t = it.tensor([0, 3, 6, 1])
    loss = F.cross_entropy(x, t)
    loss.backward(retain_graph=True)
    first = x.grad.numpy().copy()
    x.grad = None
    loss.backward()
    np.testing.assert_array_equal(x.grad.numpy(), first)


def test_cross_entropy_backward_leaves_held_logits_alone():
    """The fused loss writes its gradient over logits nobody holds any more (as llm.c); a leaf,
    or an intermediate the caller still holds, must keep its values."""
    a = np.random.default_rng(1).normal(size=(5, 9)).astype(np.float32)
    t = it.tensor([0, 3, 8, 1, 2])
    from infinitrain.ops.layers import cross_entropy  # the op itself: no reshape in between
    for loss_fn in (F.cross_entropy, lambda x, t: cross_entropy(x, t, 9)):
        leaf = it.from_numpy(a.copy()).requires_grad_()
        loss_fn(leaf, t).backward()
        np.testing.assert_array_equal(leaf.detach().numpy(), a)
        w = it.ones(9, requires_grad=True)
        held = it.from_numpy(a.copy()) * w
        loss_fn(held, t).backward()
        np.testing.assert_array_equal(held.detach().numpy(), a)


@pytest.mark.parametrize("fn", [lambda x: x.max(), lambda x: x.min(), lambda x: x.max(1)[0],
                                lambda x: x.min(0)[0], lambda x: x.maximum(x * 0.5),
                                lambda x: x.minimum(x * 0.5), lambda x: it.tril(x),
                                lambda x: it.triu(x, 1), lambda x: x.amax(1)])
def test_extremes_and_triangles_keep_the_graph(fn):
    x64 = np.random.default_rng(0).normal(size=(3, 4))
    x = it.tensor(x64, dtype=it.float64, requires_grad=True)
    out = fn(x)
    assert out.grad_fn is not None
    out.sum().backward()
    num = _num_grad(lambda a: fn(it.tensor(a, dtype=it.float64)).sum().item(), x64)
    np.testing.assert_allclose(x.grad.numpy(), num, atol=1e-6)


def test_numpy_scalar_on_the_left_stays_a_tensor():
    x = it.randn(3, requires_grad=True)
    for y in (np.float32(2) * x, np.float64(3) - x, np.int64(2) + x, np.float32(1) / (x * x + 1)):
        assert isinstance(y, it.Tensor) and y.grad_fn is not None


def test_scalar_tensor_is_0d():
    assert it.tensor(2.0).shape == ()
    assert it.tensor(3).dtype is it.int64 and it.tensor(True).dtype is it.bool


def test_dropout_p1_in_eval_returns_input():
    x = it.randn(4)
    assert F.dropout(x, 1.0, training=False) is x
    assert it.nn.Dropout(1.0).eval()(x) is x
    assert float(F.dropout(x, 1.0).abs().sum()) == 0.0


def test_cat_out_of_range_dim_raises():
    with pytest.raises(IndexError):
        it.cat([it.zeros(2, 3), it.zeros(2, 3)], 2)
    assert it.cat([it.zeros(2, 3), it.zeros(2, 3)], -1).shape == (2, 6)


def test_bf16_multi_dim_reduction_rounds_once():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(8, 16, 32)).astype(np.float32)
    x = it.tensor(a).bfloat16()
    exact = np.asarray(x.float().numpy(), np.float64).sum(axis=(0, 2))
    got = np.asarray(x.sum((0, 2)).float().numpy(), np.float64)
    # one rounding to bf16 at the end: within half an ulp of bf16 (2^-8 relative)
    assert np.all(np.abs(got - exact) <= np.abs(exact) * 2.0 ** -8 + 1e-6)


def test_f16_with_bf16_promotes_to_float32():
    assert (it.ones(2, dtype=it.float16) * it.ones(2, dtype=it.bfloat16)).dtype is it.float32
    assert (it.ones(2, dtype=it.bfloat16) + it.ones(2, dtype=it.float16)).dtype is it.float32


def test_relu_keeps_nan():
    assert np.isnan(F.relu(it.tensor([float("nan"), 1.0])).numpy()[0])
    assert np.isnan(it.tensor([float("nan")]).double().relu().item())


def test_inplace_into_expanded_view_raises():
    with pytest.raises(RuntimeError, match="single memory location"):
        it.zeros(1, 3).expand(4, 3).add_(1)


def test_valid_inputs_that_used_to_raise():
    a, b = it.randn(3, requires_grad=True), it.randn(3, requires_grad=True)
    (a @ b).backward()
    np.testing.assert_allclose(a.grad.numpy(), b.detach().numpy())
    s = it.tensor(1.5, requires_grad=True)
    s.softmax(0).backward()
    assert s.grad.item() == 0.0
    y = F.layer_norm(it.randn(2, 3), 3, None, it.full((3,), 0.5))
    np.testing.assert_allclose(y.numpy().mean(-1), 0.5, atol=1e-6)
    x = it.arange(5).float()
    assert x[it.tensor([-1, 0])].tolist() == [4.0, 0.0]
    h = it.ones(2, dtype=it.float16)
    h.add_(it.ones(2))
    assert h.dtype is it.float16 and h.tolist() == [2.0, 2.0]
    assert it.maximum(it.ones(2), it.zeros(2, dtype=it.bfloat16)).dtype is it.float32
    assert (it.ones(2, dtype=it.bfloat16) ** it.ones(2)).dtype is it.float32
    base, expo = it.tensor([2.0, 3.0], requires_grad=True), it.tensor([3.0, 0.5], requires_grad=True)
    (base ** expo).sum().backward()
    np.testing.assert_allclose(base.grad.numpy(), [3 * 4, 0.5 * 3 ** -0.5], rtol=1e-6)
    np.testing.assert_allclose(expo.grad.numpy(), [8 * np.log(2), 3 ** 0.5 * np.log(3)], rtol=1e-6)
    assert it.zeros(2, 0).softmax(-1).shape == (2, 0)


def test_comparisons_give_bool_tensors():
    x = it.tensor([1.0, 2.0, 3.0])
    assert (x == 2).dtype is it.bool and (x == 2).tolist() == [False, True, False]
    assert (x > 1).tolist() == [False, True, True] and (x <= 2).tolist() == [True, True, False]
    assert ((x > 1) & (x < 3)).tolist() == [False, True, False]
    assert (~(x > 1)).tolist() == [True, False, False]
    assert len({x, x}) == 1  # hashing stays by identity
    nan = it.tensor([float("nan")])
    assert (nan == nan).tolist() == [False] and (nan != nan).tolist() == [True]


def test_new_api_against_numpy():
    rng = np.random.default_rng(2)
    a = rng.normal(size=(3, 5)).astype(np.float32)
    x = it.tensor(a)
    np.testing.assert_allclose(it.where(x > 0, x, -1.0).numpy(), np.where(a > 0, a, -1))
    np.testing.assert_allclose(x.masked_fill(x < 0, 0.0).numpy(), np.maximum(a, 0))
    lse = np.log(np.exp(a).sum(1))
    np.testing.assert_allclose(x.logsumexp(1).numpy(), lse, rtol=1e-6)
    np.testing.assert_allclose(x.log_softmax(1).numpy(), a - lse[:, None], rtol=1e-5, atol=1e-6)
    idx = np.array([[0, 4], [1, 1], [3, 2]])
    np.testing.assert_array_equal(x.gather(1, it.tensor(idx)).numpy(), np.take_along_axis(a, idx, 1))
    np.testing.assert_array_equal(x.index_select(1, it.tensor([4, 0])).numpy(), a[:, [4, 0]])
    v, i = x.topk(2, dim=1)
    np.testing.assert_array_equal(i.numpy(), np.argsort(-a, 1, kind="stable")[:, :2])
    np.testing.assert_array_equal(v.numpy(), -np.sort(-a, 1)[:, :2])
    np.testing.assert_allclose(x.cumsum(1).numpy(), np.cumsum(a, 1), rtol=1e-6)
    assert x.argmin(1).tolist() == a.argmin(1).tolist()
    np.testing.assert_allclose(x.var(1).numpy(), a.var(1, ddof=1), rtol=1e-5)
    np.testing.assert_allclose(x.std().item(), a.std(ddof=1), rtol=1e-5)
    np.testing.assert_allclose(x.amax(0).numpy(), a.max(0))
    m = rng.normal(size=(2, 3, 4)).astype(np.float32)
    w = rng.normal(size=(2, 4, 5)).astype(np.float32)
    np.testing.assert_allclose(it.bmm(it.tensor(m), it.tensor(w)).numpy(), m @ w, rtol=1e-5)
    np.testing.assert_allclose(it.mm(x.t(), x).numpy(), a.T @ a, rtol=1e-5, atol=1e-5)
    d = it.tensor(a).double()
    assert d.dtype is it.float64 and (d @ d.t()).dtype is it.float64
    np.testing.assert_allclose((d @ d.t()).numpy(), a.astype(np.float64) @ a.T.astype(np.float64))


def test_losses_and_helpers():
    rng = np.random.default_rng(3)
    a = rng.normal(size=(4, 6)).astype(np.float32)
    t = np.array([0, 5, 2, 2])
    x = it.tensor(a, requires_grad=True)
    logp = a - np.log(np.exp(a).sum(1, keepdims=True))
    np.testing.assert_allclose(F.nll_loss(F.log_softmax(x, 1), it.tensor(t)).item(),
                               -logp[np.arange(4), t].mean(), rtol=1e-6)
    np.testing.assert_allclose(F.nll_loss(F.log_softmax(x, 1), it.tensor([0, -100, 2, 2])).item(),
                               -logp[[0, 2, 3], [0, 2, 2]].mean(), rtol=1e-6)
    np.testing.assert_allclose(F.mse_loss(x, it.zeros(4, 6)).item(), (a ** 2).mean(), rtol=1e-6)
    assert F.one_hot(it.tensor([1, 0]), 3).tolist() == [[0, 1, 0], [1, 0, 0]]
    np.testing.assert_array_equal(F.pad(it.tensor(a), (1, 2, 0, 1), value=7.0).numpy(),
                                  np.pad(a, ((0, 1), (1, 2)), constant_values=7.0))
    assert it.nn.Identity()(x) is x


def test_multinomial_draws_follow_the_weights():
    it.manual_seed(0)
    draws = it.multinomial(it.tensor([0.1, 0.0, 0.9]), 20000, replacement=True).numpy()
    freq = np.bincount(draws, minlength=3) / 20000
    assert freq[1] == 0 and abs(freq[0] - 0.1) < 0.01
    row = it.multinomial(it.tensor([[1.0, 1.0, 1.0, 1.0]]), 4).numpy()
    assert sorted(row[0].tolist()) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="without replacement"):
        it.multinomial(it.tensor([1.0, 1.0]), 3)


def test_lr_schedules():
    p = it.nn.Parameter(it.zeros(1))
    opt = it.optim.SGD([p], lr=1.0)
    sched = it.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4, eta_min=0.1)
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(5):
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    expect = [0.1 + 0.9 * (1 + np.cos(np.pi * t / 4)) / 2 for t in range(6)]  # past T_max: back up, as PyTorch
    np.testing.assert_allclose(lrs, expect)
    opt2 = it.optim.SGD([p], lr=1.0)
    lin = it.optim.lr_scheduler.LinearLR(opt2, start_factor=0.25, total_iters=3)
    got = [opt2.param_groups[0]["lr"]]
    for _ in range(4):
        lin.step()
        got.append(opt2.param_groups[0]["lr"])
    np.testing.assert_allclose(got, [0.25, 0.5, 0.75, 1.0, 1.0])


def test_native_index_errors():
    with pytest.raises(IndexError, match="out of range"):
        it.arange(5).float()[it.tensor([5])]
    with pytest.raises(IndexError, match="out of range"):
        it.zeros(2, 3).gather(1, it.tensor([[0], [3]]))


def test_floor_division_rounds_toward_negative_infinity_as_python_and_pytorch():
    a = np.array([5, -7, 7.5, -0.5, 1e20, np.inf, -np.inf, np.nan, 0.0], np.float32)
    b = np.array([2, 2, -2, 1, 3, 2, 2, 1, -3], np.float32)
    got = (it.tensor(a) // it.tensor(b)).numpy()
    finite = np.isfinite(a)
    np.testing.assert_array_equal(got[finite], np.floor_divide(a[finite], b[finite]))
    assert got[5] == np.inf and got[6] == -np.inf and np.isnan(got[7])  # PyTorch's, not numpy's NaN
    np.testing.assert_array_equal((it.tensor(a[:5]) // 2).numpy(), np.floor_divide(a[:5], 2))
    np.testing.assert_array_equal((10 // it.tensor([3.0, -3.0])).numpy(), [3.0, -4.0])
    ints = it.tensor(np.array([7, -7, 9]))
    assert (ints // 2).dtype is it.int64 and (ints // 2).tolist() == [3, -4, 4]
    assert ints.floor_divide(it.tensor(np.array([2, 2, -4]))).tolist() == [3, -4, -3]
    with pytest.raises(ZeroDivisionError):
        ints // 0
    assert not (it.tensor([3.0], requires_grad=True) // 2).requires_grad  # piecewise constant


def test_from_numpy_of_a_read_only_array_warns_that_it_copies():
    a = np.arange(3, dtype=np.float32)
    a.flags.writeable = False
    with pytest.warns(UserWarning, match="read-only, so the tensor holds a copy"):
        t = it.from_numpy(a)
    t.fill_(7.0)
    assert a.tolist() == [0, 1, 2] and t.tolist() == [7, 7, 7]


def test_an_optimizer_refuses_a_non_leaf_tensor():
    w = it.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(ValueError, match="non-leaf"):
        it.optim.AdamW([w * 2])


def test_index_assignment_of_values_that_do_not_fit_the_selection_is_refused():
    """x[mask] = [1, 2, 3] on 5 selected slots filled all five with 1; PyTorch refuses the shape
    mismatch, and spreads a fitting value as it broadcasts to the indexing result."""
    x = it.zeros(5)
    with pytest.raises(RuntimeError, match=r"shape mismatch: value tensor of shape \[3\] cannot be broadcast to "
                                           r"indexing result of shape \[5\]"):
        x[it.tensor([True] * 5)] = [1, 2, 3]
    with pytest.raises(RuntimeError, match="shape mismatch"):
        x[it.tensor([0, 1, 2])] = it.tensor([1.0, 2.0])
    x[it.tensor([True, False, True, False, True])] = [1, 2, 3]
    assert x.tolist() == [1, 0, 2, 0, 3]
    y = it.zeros(3, 2)
    y[it.tensor([0, 2])] = it.tensor([5.0, 6.0])  # one row for every selected row
    y[it.tensor([True, False, False])] = it.tensor([[7.0, 8.0]])
    assert y.tolist() == [[7, 8], [0, 0], [5, 6]]


def test_integer_floor_division_is_exact_past_two_to_the_53():
    """Integer // went through float64: (2**53 + 1) // 1 gave 2**53."""
    values = [2**53 + 1, -7, 7, -2**62, 2**62 + 3]
    x = it.tensor(values, dtype=it.int64)
    for d in (1, 2, -3, 7):
        assert (x // d).tolist() == [v // d for v in values]
    assert (x // it.tensor([1, 2, -3, 5, -1])).tolist() == [v // d for v, d in zip(values, [1, 2, -3, 5, -1])]
    assert (x // 2).dtype is it.int64
