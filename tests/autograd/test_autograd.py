"""Autograd: every differentiable op's gradient against numerical differences of an
independent float64 numpy implementation, and the engine's behaviour."""
import numpy as np
import pytest

import infinitrain as it
import infinitrain.nn.functional as F
from helpers import numerical_grad


def check(fn, ref, *arrays, rtol=1e-3, atol=1e-4, seed=0):
    """Backward of sum(fn(*tensors) * G) against central differences of sum(ref(*arrays) * G)."""
    rng = np.random.default_rng(seed)
    ts = [it.tensor(a.astype(np.float32), requires_grad=True) for a in arrays]
    out = fn(*ts)
    G = rng.standard_normal(out.shape)
    np.testing.assert_allclose(out.detach().numpy(), ref(*arrays), rtol=1e-4, atol=1e-5)
    (out * it.tensor(G.astype(np.float32))).sum().backward()
    for i, (t, a) in enumerate(zip(ts, arrays)):
        def f(x, i=i):
            args = list(arrays)
            args[i] = x
            return np.sum(ref(*args) * G)
        np.testing.assert_allclose(t.grad.numpy(), numerical_grad(f, a), rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i}")


R = np.random.default_rng(1)


def r(*shape, positive=False):
    a = R.standard_normal(shape)
    return np.abs(a) + 0.5 if positive else a


@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (2, 3))])
def test_broadcast_arithmetic(shapes):
    a, b = r(*shapes[0]), r(*shapes[1], positive=True)
    check(lambda x, y: x + y, np.add, a, b)
    check(lambda x, y: x - y, np.subtract, a, b)
    check(lambda x, y: x * y, np.multiply, a, b)
    check(lambda x, y: x / y, np.divide, a, b)


def test_scalar_arithmetic():
    a = r(5, 3, positive=True)
    check(lambda x: 2.0 - x * 3.0 + 1.5, lambda x: 2.0 - x * 3.0 + 1.5, a)
    check(lambda x: 2.0 / x, lambda x: 2.0 / x, a)
    check(lambda x: x / 4.0, lambda x: x / 4.0, a)
    check(lambda x: x ** 3, lambda x: x ** 3, a)
    check(lambda x: x ** 0.5, np.sqrt, a)


@pytest.mark.parametrize("name,ref,positive", [
    ("exp", np.exp, False), ("log", np.log, True), ("sqrt", np.sqrt, True),
    ("rsqrt", lambda x: 1 / np.sqrt(x), True), ("tanh", np.tanh, False),
    ("sigmoid", lambda x: 1 / (1 + np.exp(-x)), False), ("sin", np.sin, False),
    ("cos", np.cos, False), ("square", np.square, False), ("reciprocal", np.reciprocal, True),
    ("neg", np.negative, False)])
def test_unary(name, ref, positive):
    fn = (lambda x: -x) if name == "neg" else (lambda x: getattr(x, name)())
    check(fn, ref, r(4, 7, positive=positive))


def test_activations():
    a = r(6, 5)
    a = a + np.sign(a) * 0.05
    check(F.relu, lambda x: np.maximum(x, 0), a)
    check(F.silu, lambda x: x / (1 + np.exp(-x)), a)
    check(lambda x: F.gelu(x, approximate="tanh"),
          lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))), a)
    check(F.swiglu, lambda g, u: g / (1 + np.exp(-g)) * u, a, r(6, 5))
    check(lambda x: x.clamp(-0.3, 0.4), lambda x: np.clip(x, -0.3, 0.4), a)


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)),
                                   ((2, 1, 3, 4), (3, 4, 2)), ((4,), (4, 3)), ((3, 4), (4,))])
def test_matmul(sa, sb):
    check(lambda x, y: x @ y, np.matmul, r(*sa), r(*sb))


def test_matmul_transposed_operand():
    check(lambda x, y: x @ y.t(), lambda x, y: x @ y.T, r(3, 4), r(5, 4))


@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (1, True), ((0, 2), False), (-1, False)])
def test_sum_mean(dim, keepdim):
    a = r(2, 3, 4)
    axis = tuple(dim) if isinstance(dim, tuple) else dim
    check(lambda x: x.sum(dim, keepdim), lambda x: np.sum(x, axis=axis, keepdims=keepdim), a)
    check(lambda x: x.mean(dim, keepdim), lambda x: np.mean(x, axis=axis, keepdims=keepdim), a)


def test_softmax():
    def ref(x, axis):
        e = np.exp(x - x.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)
    a = r(3, 4, 5)
    check(lambda x: x.softmax(-1), lambda x: ref(x, -1), a)
    check(lambda x: F.softmax(x, 1), lambda x: ref(x, 1), a)


def test_views():
    a = r(2, 3, 4)
    check(lambda x: x.reshape(6, 4) * 2, lambda x: x.reshape(6, 4) * 2, a)
    check(lambda x: x.permute(2, 0, 1).contiguous(), lambda x: x.transpose(2, 0, 1), a)
    check(lambda x: x.transpose(0, 2)[1:, :, ::2], lambda x: x.transpose(2, 1, 0)[1:, :, ::2], a)
    check(lambda x: x[:, :1].expand(2, 5, 4), lambda x: np.broadcast_to(x[:, :1], (2, 5, 4)), a)
    check(lambda x: x.unsqueeze(1).squeeze(1)[0], lambda x: x[0], a)
    check(lambda x: x.narrow(2, 1, 2).flatten(), lambda x: x[:, :, 1:3].reshape(-1), a)
    check(lambda x: x[it.tensor([2, 0, 2])], lambda x: x[[2, 0, 2]], r(4, 3))
    check(lambda x: x.to(it.float32) * 1.0, lambda x: x * 1.0, a)


def test_cat_stack():
    check(lambda x, y: it.cat([x, y, x], 1), lambda x, y: np.concatenate([x, y, x], 1), r(2, 3), r(2, 4))
    check(lambda x, y: it.stack([x, y], 0), lambda x, y: np.stack([x, y], 0), r(2, 3), r(2, 3))


def test_nn_functional():
    x, w, b = r(4, 6), r(5, 6), r(5)
    check(F.linear, lambda x_, w_, b_: x_ @ w_.T + b_, x, w, b)
    check(lambda x_, w_: F.linear(x_, w_), lambda x_, w_: x_ @ w_.T, r(2, 3, 6), w)

    def ln(x_, w_, b_):
        m = x_.mean(-1, keepdims=True)
        return (x_ - m) / np.sqrt(x_.var(-1, keepdims=True) + 1e-5) * w_ + b_
    check(lambda x_, w_, b_: F.layer_norm(x_, 6, w_, b_), ln, x, r(6), r(6))
    check(lambda x_, w_: F.rms_norm(x_, 6, w_, 1e-6),
          lambda x_, w_: x_ / np.sqrt((x_ ** 2).mean(-1, keepdims=True) + 1e-6) * w_, x, r(6))


def test_cross_entropy_and_embedding():
    targets = np.array([1, 4, -100, 0])

    def ce(logits):
        m = logits.max(-1, keepdims=True)
        lse = np.log(np.exp(logits - m).sum(-1)) + m[:, 0]
        keep = targets != -100
        return np.mean((lse - logits[np.arange(4), np.where(keep, targets, 0)])[keep])
    logits = it.tensor(r(4, 5).astype(np.float32), requires_grad=True)
    loss = F.cross_entropy(logits, it.tensor(targets))
    assert abs(loss.item() - ce(logits.detach().numpy().astype(np.float64))) < 1e-5
    loss.backward()
    np.testing.assert_allclose(logits.grad.detach().numpy(), numerical_grad(ce, logits.detach().numpy()),
                               rtol=1e-3, atol=1e-5)
    per_row = F.cross_entropy(logits.detach(), it.tensor(targets), reduction="none")
    assert per_row.shape == (4,) and per_row.numpy()[2] == 0
    idx = np.array([[1, 3, 1], [0, 0, 2]])
    check(lambda w_: F.embedding(it.tensor(idx), w_), lambda w_: w_[idx], r(4, 5))


def test_attention_and_rotary():
    def attn(q, k, v):
        T, D = q.shape[-2:]
        k, v = np.repeat(k, q.shape[1] // k.shape[1], 1), np.repeat(v, q.shape[1] // k.shape[1], 1)
        s = q @ np.swapaxes(k, -1, -2) / np.sqrt(D)
        s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        return (p / p.sum(-1, keepdims=True)) @ v
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
          attn, r(1, 4, 5, 4), r(1, 2, 5, 4), r(1, 2, 5, 4))
    cos, sin = np.cos(r(5, 2)), np.sin(r(5, 2))

    def rope(x):
        out = np.empty_like(x)
        c, s = cos[None, :, None], sin[None, :, None]
        out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
        out[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
        return out
    check(lambda x: F.rotary_embedding(x, it.tensor(cos.astype(np.float32)), it.tensor(sin.astype(np.float32))),
          rope, r(2, 5, 3, 4), rtol=2e-3, atol=2e-4)


def test_dropout_mask_is_consistent():
    it.manual_seed(3)
    x = it.ones(2000, requires_grad=True)
    y = F.dropout(x, 0.25, training=True)
    kept = y.detach().numpy() != 0
    assert 0.7 < kept.mean() < 0.8
    np.testing.assert_allclose(y.detach().numpy()[kept], 1 / 0.75, rtol=1e-6)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy() != 0, kept)
    assert F.dropout(x, 0.25, training=False) is x


# ---- engine -------------------------------------------------------------------------------
def test_shared_inputs_and_accumulation():
    x = it.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x * x + x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3, 5, 7])
    (x * 2).sum().backward()  # accumulates into .grad
    np.testing.assert_allclose(x.grad.numpy(), [5, 7, 9])
    a, b = it.tensor([1.0], requires_grad=True), it.tensor([2.0], requires_grad=True)
    (a + b).sum().backward()  # one gradient object reaches two leaves
    a.grad += 1.0
    assert b.grad.item() == 1.0


def test_second_backward_needs_retain_graph():
    x = it.tensor([1.0, 2.0], requires_grad=True)
    y = (x.exp() * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


def test_no_grad_and_errors():
    x = it.tensor([1.0, 2.0], requires_grad=True)
    with it.no_grad():
        y = x * 2
    assert not y.requires_grad and y.grad_fn is None
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.sum().backward()
    with pytest.raises(RuntimeError, match="non-scalar"):
        (x * 2).backward()
    with pytest.raises(RuntimeError, match="in-place|bypass autograd"):
        x.add_(1.0)
    with pytest.raises(TypeError, match="floating-point"):
        it.tensor([1, 2]).requires_grad_()
    z = x.detach()
    assert not z.requires_grad and z.data_ptr() == x.data_ptr()
    assert "grad_fn=<MulBackward>" in repr(x * 2)


def test_hooks():
    x = it.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    y.register_hook(lambda g: g * 10)  # non-leaf: rewrites the gradient flowing back
    seen = []
    x.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.numpy().copy()))
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [30, 30])
    assert len(seen) == 1 and seen[0].tolist() == [30, 30]
    w = it.tensor([1.0], requires_grad=True)
    w.register_hook(lambda g: g * 0.5)
    (w * 4).sum().backward()
    assert w.grad.item() == 2.0


def test_post_accumulate_hooks_fire_during_backward():
    """Leaves near the loss get their gradients (and hooks) before the rest of backward runs:
    what lets DDP start all-reduces early."""
    order = []
    a = it.tensor([1.0], requires_grad=True)
    b = it.tensor([1.0], requires_grad=True)
    a.register_post_accumulate_grad_hook(lambda p: order.append("a"))
    b.register_post_accumulate_grad_hook(lambda p: order.append("b"))
    h = (a * 2).exp()      # a is far from the loss
    out = (h * b).sum()    # b is next to it
    out.backward()
    assert order == ["b", "a"]


def test_leaf_used_twice_accumulates_once():
    """A weight used twice (a tied embedding) gets one summed accumulation and one hook call:
    DDP must not start its all-reduce before the second contribution has landed."""
    w = it.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    seen = []
    w.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.numpy().copy()))
    x = it.tensor([[1.0, 1.0]])
    (F.embedding(it.tensor([1]), w).sum() + (x @ w.t()).sum()).backward()
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0], [[1, 1], [2, 2]])


def test_grad_returns_gradients_without_touching_dot_grad():
    """autograd.grad (torch.autograd.grad): the gradients backward would accumulate, returned;
    no leaf's .grad changes, for leaf and non-leaf inputs alike."""
    a = it.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
    b = it.tensor([2.0, -1.0], requires_grad=True)
    h = (a * b).tanh()
    out = (h * h).sum() + (a @ b).sum()
    ga, gb, gh = it.autograd.grad(out, [a, b, h], retain_graph=True)
    assert a.grad is None and b.grad is None
    out.backward()
    np.testing.assert_allclose(ga.numpy(), a.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(gb.numpy(), b.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(gh.numpy(), 2 * h.detach().numpy(), rtol=1e-6)
    (g,) = it.autograd.grad((a * 3).sum(), a, grad_outputs=it.tensor(2.0))
    np.testing.assert_allclose(g.numpy(), np.full((2, 2), 6.0))
    unused = it.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="input 1 was not used"):
        it.autograd.grad((a * 2).sum(), [a, unused])
    assert it.autograd.grad((a * 2).sum(), [a, unused], allow_unused=True)[1] is None
    with pytest.raises(RuntimeError, match="input 0 does not require grad"):
        it.autograd.grad((a * 2).sum(), [it.ones(2)])
