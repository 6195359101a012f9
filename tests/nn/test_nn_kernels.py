"""Norms, softmax, cross-entropy, attention, rotary and token embeddings, optimizer updates:
forward against numpy, backward against numerical differences of the numpy forward."""
import numpy as np
import pytest

import infinitrain as it
from infinitrain.kernels import neural as nn, optim
from helpers import bf16_round, numerical_grad, to_np

DTYPES = [it.float32, it.bfloat16]


def make(a, dtype):
    a = np.asarray(a, np.float32)
    if dtype is it.bfloat16:
        return it.tensor(a, dtype=it.bfloat16), bf16_round(a)
    return it.tensor(a), a


def tol(dtype, f32=(1e-5, 1e-5)):
    return dict(rtol=2e-2, atol=2e-2) if dtype is it.bfloat16 else dict(rtol=f32[0], atol=f32[1])


# ---- references (float64 numpy) ----------------------------------------------------------
def layernorm_ref(x, w, b, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def rmsnorm_ref(x, w, eps=1e-6):
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w


def softmax_ref(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def attention_ref(q, k, v, scale=None, causal=True):
    """Causal masks aligned to the bottom right: query i sees keys j <= i + Tk - Tq."""
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    group = H // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(D) if scale is None else scale)
    if causal:
        s = np.where(np.tril(np.ones((Tq, Tk), bool), Tk - Tq), s, -np.inf)
    return softmax_ref(s) @ v


def rope_tables(T, D, theta=10000.0):
    inv = 1.0 / theta ** (np.arange(0, D, 2) / D)
    ang = np.outer(np.arange(T), inv)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def rope_ref(x, cos, sin):
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


# ---- LayerNorm / RMSNorm -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 5, 768), (4, 1031)])
def test_layernorm_forward(shape, dtype, rng):
    x, xr = make(rng.standard_normal(shape) * 2 + 0.5, dtype)
    w, wr = make(rng.standard_normal(shape[-1]), dtype)
    b, br = make(rng.standard_normal(shape[-1]), dtype)
    out, mean, rstd = nn.layer_norm(x, w, b)
    np.testing.assert_allclose(to_np(out), layernorm_ref(xr.astype(np.float64), wr, br), **tol(dtype))
    np.testing.assert_allclose(mean.numpy(), xr.mean(-1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rstd.numpy(), 1 / np.sqrt(xr.var(-1) + 1e-5), rtol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm_of_a_row_with_an_infinity_is_nan_as_pytorchs(dtype):
    """mean = inf, so x - mean and the variance are NaN: the whole row (it once gave -inf for
    the finite entries, the NaN variance clamped to 0); the other rows are untouched."""
    x, _ = make(np.array([[1, np.inf, 2, 3], [1, 2, 3, 4], [-np.inf, 0, 0, 0], [np.nan, 1, 2, 3]]), dtype)
    out = to_np(nn.layer_norm(x, None, None)[0])
    assert np.isnan(out[[0, 2, 3]]).all(), out
    np.testing.assert_allclose(out[1], [-1.3416355, -0.4472118, 0.4472118, 1.3416355], **tol(dtype))


def test_layernorm_backward_numerical(rng):
    x, w, b, g = (rng.standard_normal((3, 11)), rng.standard_normal(11), rng.standard_normal(11),
                  rng.standard_normal((3, 11)))
    f = lambda x_, w_, b_: np.sum(layernorm_ref(x_, w_, b_) * g)  # noqa: E731
    tx, tw, tb = (it.tensor(a.astype(np.float32)) for a in (x, w, b))
    _, mean, rstd = nn.layer_norm(tx, tw, tb)
    dx, dw, db = nn.layer_norm_backward(it.tensor(g.astype(np.float32)), tx, tw, mean, rstd)
    np.testing.assert_allclose(dx.numpy(), numerical_grad(lambda a: f(a, w, b), x), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw.numpy(), numerical_grad(lambda a: f(x, a, b), w), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db.numpy(), numerical_grad(lambda a: f(x, w, a), b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm_backward_large(dtype, rng):
    """Realistic sizes: against the float64 analytic gradient of the reference."""
    x, w, b, g = (rng.standard_normal(s).astype(np.float32) for s in [(64, 768), 768, 768, (64, 768)])
    tx, xr = make(x, dtype)
    tw, wr = make(w, dtype)
    tg, gr = make(g, dtype)
    _, mean, rstd = nn.layer_norm(tx, tw, make(b, dtype)[0])
    dx, dw, db = nn.layer_norm_backward(tg, tx, tw, mean, rstd)
    xr, wr, gr = xr.astype(np.float64), wr.astype(np.float64), gr.astype(np.float64)
    m, r = xr.mean(-1, keepdims=True), 1 / np.sqrt(xr.var(-1, keepdims=True) + 1e-5)
    xhat = (xr - m) * r
    dxhat = gr * wr
    dx_ref = r * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    np.testing.assert_allclose(to_np(dx), dx_ref, **tol(dtype, (1e-4, 1e-4)))
    np.testing.assert_allclose(to_np(dw), (gr * xhat).sum(0),
                               **tol(dtype, (1e-4, 1e-4)) if dtype is it.float32 else dict(rtol=3e-2, atol=0.3))
    np.testing.assert_allclose(to_np(db), gr.sum(0),
                               **tol(dtype, (1e-4, 1e-4)) if dtype is it.float32 else dict(rtol=3e-2, atol=0.3))


def test_layernorm_without_affine(rng):
    x = rng.standard_normal((4, 9))
    out, mean, rstd = nn.layer_norm(it.tensor(x.astype(np.float32)), None, None)
    np.testing.assert_allclose(out.numpy(), layernorm_ref(x, 1, 0), rtol=1e-5, atol=1e-5)
    g = rng.standard_normal((4, 9))
    dx, dw, db = nn.layer_norm_backward(it.tensor(g.astype(np.float32)), it.tensor(x.astype(np.float32)), None,
                                        mean, rstd)
    assert dw is None and db is None
    np.testing.assert_allclose(dx.numpy(), numerical_grad(lambda a: np.sum(layernorm_ref(a, 1, 0) * g), x),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_forward(dtype, rng):
    x, xr = make(rng.standard_normal((5, 257)), dtype)
    w, wr = make(rng.standard_normal(257), dtype)
    out, rstd = nn.rms_norm(x, w)
    np.testing.assert_allclose(to_np(out), rmsnorm_ref(xr.astype(np.float64), wr), **tol(dtype))


def test_rmsnorm_backward_numerical(rng):
    x, w, g = rng.standard_normal((3, 13)), rng.standard_normal(13), rng.standard_normal((3, 13))
    f = lambda x_, w_: np.sum(rmsnorm_ref(x_, w_) * g)  # noqa: E731
    tx, tw = it.tensor(x.astype(np.float32)), it.tensor(w.astype(np.float32))
    _, rstd = nn.rms_norm(tx, tw)
    dx, dw = nn.rms_norm_backward(it.tensor(g.astype(np.float32)), tx, tw, rstd)
    np.testing.assert_allclose(dx.numpy(), numerical_grad(lambda a: f(a, w), x), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw.numpy(), numerical_grad(lambda a: f(x, a), w), rtol=1e-4, atol=1e-4)


# ---- softmax ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((1,), -1), ((3, 17), -1), ((4, 50257), -1), ((5, 6, 7), 1)])
def test_softmax(shape, dim, dtype, rng):
    x, xr = make(rng.standard_normal(shape) * 4, dtype)
    out = nn.softmax(x, dim)
    ref = softmax_ref(np.moveaxis(xr.astype(np.float64), dim, -1))
    np.testing.assert_allclose(to_np(out), np.moveaxis(ref, -1, dim), **tol(dtype, (1e-5, 1e-7)))


def test_softmax_backward_numerical(rng):
    x, g = rng.standard_normal((4, 9)), rng.standard_normal((4, 9))
    out = nn.softmax(it.tensor(x.astype(np.float32)))
    dx = nn.softmax_backward(it.tensor(g.astype(np.float32)), out)
    np.testing.assert_allclose(dx.numpy(), numerical_grad(lambda a: np.sum(softmax_ref(a) * g), x),
                               rtol=1e-4, atol=1e-5)


def test_softmax_large_values_stable():
    out = nn.softmax(it.tensor([[1000.0, 1000.0, -1000.0]]))
    np.testing.assert_allclose(out.numpy(), [[0.5, 0.5, 0.0]])


# ---- cross-entropy ---------------------------------------------------------------------
def ce_ref(logits, targets, vocab, ignore=-100):
    x = logits[:, :vocab].astype(np.float64)
    lse = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    losses = np.array([0.0 if t == ignore else lse[i] - x[i, t] for i, t in enumerate(targets)])
    return losses, lse


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("target_dtype", [it.int32, it.int64])
@pytest.mark.parametrize("rows,vocab,padded", [(1, 1, 1), (7, 13, 13), (6, 50257, 50304)])
def test_cross_entropy(rows, vocab, padded, target_dtype, dtype, rng):
    logits = (rng.standard_normal((rows, padded)) * 3).astype(np.float32)
    logits[:, vocab:] = 1e4  # padded columns must never enter the softmax
    targets = rng.integers(0, vocab, rows)
    if rows > 2:
        targets[2] = -100
    tl, lr = make(logits, dtype)
    tt = it.tensor(targets, dtype=target_dtype)
    losses, lse = nn.cross_entropy(tl, tt, vocab)
    ref_losses, ref_lse = ce_ref(lr, targets, vocab)
    np.testing.assert_allclose(losses.numpy(), ref_losses, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse.numpy(), ref_lse, rtol=1e-6, atol=1e-5)
    dl = rng.standard_normal(rows).astype(np.float32)
    dlogits = nn.cross_entropy_backward(it.tensor(dl), tl, lse, tt, vocab)
    x = lr[:, :vocab].astype(np.float64)
    p = np.exp(x - ref_lse[:, None])
    expected = np.zeros((rows, padded))
    for i, t in enumerate(targets):
        if t != -100:
            expected[i, :vocab] = p[i] * dl[i]
            expected[i, t] -= dl[i]
    np.testing.assert_allclose(to_np(dlogits), expected, **tol(dtype, (1e-5, 1e-6)))


def test_cross_entropy_gradient_numerical(rng):
    logits, targets = rng.standard_normal((5, 7)), np.array([0, 6, 3, 3, 1])
    tl, tt = it.tensor(logits.astype(np.float32)), it.tensor(targets)
    _, lse = nn.cross_entropy(tl, tt)
    dlogits = nn.cross_entropy_backward(it.full((5,), 0.2), tl, lse, tt)
    f = lambda a: ce_ref(a, targets, 7)[0].mean()  # noqa: E731
    np.testing.assert_allclose(dlogits.numpy(), numerical_grad(f, logits), rtol=1e-4, atol=1e-6)


def test_cross_entropy_bad_target():
    with pytest.raises(IndexError, match="target 9 at position 1 is outside the vocabulary"):
        nn.cross_entropy(it.zeros(2, 5), it.tensor([1, 9]))
    with pytest.raises(TypeError, match="int32 or int64"):
        nn.cross_entropy(it.zeros(2, 5), it.zeros(2))


# ---- attention -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,H,Hkv,T,D", [(1, 1, 1, 1, 4), (2, 4, 4, 9, 8), (2, 6, 2, 17, 16), (1, 8, 1, 64, 32)])
def test_attention_forward(B, H, Hkv, T, D, dtype, rng):
    q, qr = make(rng.standard_normal((B, H, T, D)), dtype)
    k, kr = make(rng.standard_normal((B, Hkv, T, D)), dtype)
    v, vr = make(rng.standard_normal((B, Hkv, T, D)), dtype)
    out, lse = nn.attention(q, k, v)
    np.testing.assert_allclose(to_np(out), attention_ref(qr.astype(np.float64), kr, vr), **tol(dtype))
    assert lse.shape == (B, H, T)


@pytest.mark.parametrize("H,Hkv", [(2, 2), (4, 2), (3, 1)])
def test_attention_backward_numerical(H, Hkv, rng):
    B, T, D = 2, 5, 4
    q, k, v = (rng.standard_normal((B, H, T, D)), rng.standard_normal((B, Hkv, T, D)),
               rng.standard_normal((B, Hkv, T, D)))
    g = rng.standard_normal((B, H, T, D))
    tq, tk, tv = (it.tensor(a.astype(np.float32)) for a in (q, k, v))
    out, lse = nn.attention(tq, tk, tv)
    dq, dk, dv = nn.attention_backward(it.tensor(g.astype(np.float32)), tq, tk, tv, out, lse)
    f = lambda q_, k_, v_: np.sum(attention_ref(q_, k_, v_) * g)  # noqa: E731
    np.testing.assert_allclose(dq.numpy(), numerical_grad(lambda a: f(a, k, v), q), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dk.numpy(), numerical_grad(lambda a: f(q, a, v), k), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dv.numpy(), numerical_grad(lambda a: f(q, k, a), v), rtol=1e-4, atol=1e-4)


def test_attention_backward_bf16_close_to_f32(rng):
    B, H, Hkv, T, D = 1, 4, 2, 33, 16
    arrs = [bf16_round(rng.standard_normal(s)) for s in [(B, H, T, D), (B, Hkv, T, D), (B, Hkv, T, D), (B, H, T, D)]]
    grads = {}
    for dt in DTYPES:
        q, k, v, g = (it.tensor(a, dtype=dt) for a in arrs)
        out, lse = nn.attention(q, k, v)
        grads[dt] = [to_np(x) for x in nn.attention_backward(g, q, k, v, out, lse)]
    for a, b in zip(grads[it.float32], grads[it.bfloat16]):
        np.testing.assert_allclose(b, a, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("causal,Tq,Tk", [(False, 5, 5), (False, 3, 7), (True, 3, 7), (False, 6, 2)])
def test_attention_blocks_numerical(causal, Tq, Tk, rng):
    """Blocks of a longer sequence (what context parallelism computes): queries and keys of
    different lengths, with or without the (bottom-right) causal mask."""
    B, H, Hkv, D = 1, 4, 2, 4
    q, k, v = (rng.standard_normal((B, H, Tq, D)), rng.standard_normal((B, Hkv, Tk, D)),
               rng.standard_normal((B, Hkv, Tk, D)))
    g = rng.standard_normal((B, H, Tq, D))
    tq, tk, tv = (it.tensor(a.astype(np.float32)) for a in (q, k, v))
    out, lse = nn.attention(tq, tk, tv, causal=causal)
    np.testing.assert_allclose(out.numpy(), attention_ref(q, k, v, causal=causal), rtol=1e-5, atol=1e-5)
    dq, dk, dv = nn.attention_backward(it.tensor(g.astype(np.float32)), tq, tk, tv, out, lse, causal=causal)
    f = lambda q_, k_, v_: np.sum(attention_ref(q_, k_, v_, causal=causal) * g)  # noqa: E731
    np.testing.assert_allclose(dq.numpy(), numerical_grad(lambda a: f(a, k, v), q), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dk.numpy(), numerical_grad(lambda a: f(q, a, v), k), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dv.numpy(), numerical_grad(lambda a: f(q, k, a), v), rtol=1e-4, atol=1e-4)


def attention_grads_ref(q, k, v, g, causal, bias):
    """dq, dk, dv of sum(attention(q, k, v) * g) in float64, from the softmax's gradient."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    group = H // Hkv
    ke, ve = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = q @ np.swapaxes(ke, -1, -2) / np.sqrt(D) + bias
    if causal:
        s = np.where(np.tril(np.ones((Tq, Tk), bool), Tk - Tq), s, -np.inf)
    p = softmax_ref(s)
    dp = g @ np.swapaxes(ve, -1, -2)
    ds = p * (dp - np.sum(dp * p, -1, keepdims=True)) / np.sqrt(D)
    dk, dv = np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ g
    return ds @ ke, dk.reshape(B, Hkv, group, Tk, D).sum(2), dv.reshape(B, Hkv, group, Tk, D).sum(2)


@pytest.mark.parametrize("causal,Tq,Tk,masked", [(True, 150, 150, False), (True, 100, 170, True),
                                                 (False, 130, 70, True)])
def test_attention_backward_over_several_query_blocks(causal, Tq, Tk, masked, rng):
    """Longer than one query block (64 rows): dK and dV are summed over the blocks' rows."""
    B, H, Hkv, D = 2, 4, 2, 16
    q, g = rng.standard_normal((2, B, H, Tq, D))
    k, v = rng.standard_normal((2, B, Hkv, Tk, D))
    bias = np.zeros((B, H, Tq, Tk))
    if masked:  # an additive mask: random, some keys -inf (never the first: no row is all masked)
        bias = rng.standard_normal(bias.shape)
        bias[..., 1:][rng.random((B, H, Tq, Tk - 1)) < 0.2] = -np.inf
    t = [it.tensor(a.astype(np.float32)) for a in (q, k, v, g, bias)]
    out, lse = nn.attention(*t[:3], causal=causal, bias=t[4])
    grads = nn.attention_backward(t[3], *t[:3], out, lse, causal=causal, bias=t[4])
    for ours, ref in zip(grads, attention_grads_ref(q, k, v, g, causal, bias)):
        np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_merge_of_blocks_is_the_whole(dtype, rng):
    """Attention over keys [0, 7) then [7, 12) merged by log-sum-exp equals attention over all
    12 keys; the backward of each block with the whole row's out and lse gives that block's
    part of dq and its dk, dv."""
    B, H, Hkv, T, Tk, D = 2, 4, 2, 5, 12, 8
    q, qr = make(rng.standard_normal((B, H, T, D)), dtype)
    k, kr = make(rng.standard_normal((B, Hkv, Tk, D)), dtype)
    v, vr = make(rng.standard_normal((B, Hkv, Tk, D)), dtype)
    g, _ = make(rng.standard_normal((B, H, T, D)), dtype)
    out, lse = it.zeros(B, H, T, D), it.full((B, H, T), float("-inf"))
    for a, b in ((0, 7), (7, Tk)):
        block_out, block_lse = nn.attention(q, k[:, :, a:b], v[:, :, a:b], causal=False)
        nn.attention_merge(out, lse, block_out, block_lse)
    whole, whole_lse = nn.attention(q, k, v, causal=False)
    np.testing.assert_allclose(out.numpy(), to_np(whole), **tol(dtype))
    np.testing.assert_allclose(lse.numpy(), whole_lse.numpy(), rtol=1e-5, atol=1e-5)
    dq, dk, dv = nn.attention_backward(g, q, k, v, whole, whole_lse, causal=False)
    parts = [nn.attention_backward(g, q, k[:, :, a:b], v[:, :, a:b], whole, whole_lse, causal=False)
             for a, b in ((0, 7), (7, Tk))]
    np.testing.assert_allclose(to_np(parts[0][0]) + to_np(parts[1][0]), to_np(dq), **tol(dtype))
    np.testing.assert_allclose(np.concatenate([to_np(p[1]) for p in parts], 2), to_np(dk), **tol(dtype))
    np.testing.assert_allclose(np.concatenate([to_np(p[2]) for p in parts], 2), to_np(dv), **tol(dtype))
    # into the second half of a longer result
    out2, lse2 = it.zeros(B, H, 2 * T, D), it.full((B, H, 2 * T), float("-inf"))
    nn.attention_merge(out2, lse2, whole, whole_lse, row_offset=T)
    np.testing.assert_allclose(out2.numpy()[:, :, T:], to_np(whole), rtol=1e-6, atol=1e-6)
    assert np.all(out2.numpy()[:, :, :T] == 0)


def test_attention_shape_errors():
    with pytest.raises(ValueError, match="at least as many keys"):
        nn.attention(it.zeros(1, 2, 4, 8), it.zeros(1, 2, 3, 8), it.zeros(1, 2, 3, 8))
    with pytest.raises(ValueError, match="outside"):
        nn.attention_merge(it.zeros(1, 1, 2, 4), it.zeros(1, 1, 2), it.zeros(1, 1, 2, 4), it.zeros(1, 1, 2), 1)
    with pytest.raises(ValueError, match="multiple"):
        nn.attention(it.zeros(1, 3, 4, 8), it.zeros(1, 2, 4, 8), it.zeros(1, 2, 4, 8))
    with pytest.raises(ValueError, match=r"\[B, H, T, D\]"):
        nn.attention(it.zeros(3, 4, 8), it.zeros(3, 4, 8), it.zeros(3, 4, 8))


# ---- rotary embedding ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_forward_backward(dtype, rng):
    B, T, H, D = 2, 7, 3, 8
    cos, sin = rope_tables(T + 3, D)  # longer tables than the sequence are fine
    x, xr = make(rng.standard_normal((B, T, H, D)), dtype)
    out = nn.rope(x, it.tensor(cos), it.tensor(sin))
    np.testing.assert_allclose(to_np(out), rope_ref(xr, cos[:T], sin[:T]), **tol(dtype))
    g = rng.standard_normal((B, T, H, D))
    dx = nn.rope_backward(it.tensor(g.astype(np.float32)), it.tensor(cos), it.tensor(sin))
    num = numerical_grad(lambda a: np.sum(rope_ref(a, cos[:T].astype(np.float64), sin[:T].astype(np.float64)) * g), xr)
    np.testing.assert_allclose(dx.numpy(), num, rtol=1e-4, atol=1e-4)


# ---- embedding -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [it.int32, it.int64])
def test_embedding(dtype, index_dtype, rng):
    V, C = 11, 300
    w, wr = make(rng.standard_normal((V, C)), dtype)
    idx = rng.integers(0, V, (3, 40))
    idx[0, :5] = 4  # repeated tokens accumulate
    ti = it.tensor(idx, dtype=index_dtype)
    out = nn.embedding(w, ti)
    np.testing.assert_array_equal(to_np(out), wr[idx])
    g, gr = make(rng.standard_normal((3, 40, C)), dtype)
    dw = nn.embedding_backward(it.zeros(V, C, dtype=dtype), g, ti)
    expected = np.zeros((V, C))
    np.add.at(expected, idx.reshape(-1), gr.reshape(-1, C))
    np.testing.assert_allclose(to_np(dw), expected,
                               **tol(dtype, (1e-5, 1e-5)) if dtype is it.float32 else dict(rtol=5e-2, atol=0.2))


def test_embedding_out_of_range():
    with pytest.raises(IndexError, match="index 7 at position 1 is out of range for 5 embeddings"):
        nn.embedding(it.zeros(5, 3), it.tensor([0, 7]))
    with pytest.raises(IndexError, match="-1"):
        nn.embedding(it.zeros(5, 3), it.tensor([-1]))


# ---- optimizers ------------------------------------------------------------------------
def adamw_ref(p, g, m, v, lr, b1, b2, eps, wd, step):
    p = p * (1 - lr * wd)
    m = m + (1 - b1) * (g - m)
    v = v * b2 + (1 - b2) * g * g
    denom = np.sqrt(v) / np.sqrt(1 - b2 ** step) + eps
    return p - lr / (1 - b1 ** step) * m / denom, m, v


@pytest.mark.parametrize("dtype", DTYPES)
def test_adamw(dtype, rng):
    n = 5003
    p, pr = make(rng.standard_normal(n), dtype)
    m, v = it.zeros(n), it.zeros(n)
    mr, vr = np.zeros(n), np.zeros(n)
    for step in range(1, 4):
        g, gr = make(rng.standard_normal(n), dtype)
        optim.adamw_step(p, g, m, v, lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, step=step)
        pr, mr, vr = adamw_ref(pr.astype(np.float64), gr, mr, vr, 1e-2, 0.9, 0.95, 1e-8, 0.1, step)
        if dtype is it.bfloat16:
            pr = bf16_round(pr)
    np.testing.assert_allclose(to_np(p), pr, **tol(dtype, (1e-5, 1e-6)))
    np.testing.assert_allclose(m.numpy(), mr, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v.numpy(), vr, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("nesterov,dampening", [(False, 0.0), (True, 0.0), (False, 0.3)])
def test_sgd_momentum(nesterov, dampening, rng):
    n, lr, mom, wd = 301, 0.1, 0.9, 0.01
    p0 = rng.standard_normal(n)
    p, buf = it.tensor(p0.astype(np.float32)), it.zeros(n)
    pr, br = p0.copy(), None
    for step in range(3):
        g = rng.standard_normal(n)
        optim.sgd_step(p, it.tensor(g.astype(np.float32)), buf, lr=lr, momentum=mom, dampening=dampening,
                       weight_decay=wd, nesterov=nesterov, first_step=step == 0)
        d = g + wd * pr
        br = d if br is None else mom * br + (1 - dampening) * d
        pr = pr - lr * (d + mom * br if nesterov else br)
    np.testing.assert_allclose(p.numpy(), pr, rtol=1e-5, atol=1e-6)


def test_optimizer_argument_errors():
    p = it.zeros(4)
    with pytest.raises(ValueError, match="step must be >= 1"):
        optim.adamw_step(p, it.zeros(4), it.zeros(4), it.zeros(4), lr=1, beta1=0.9, beta2=0.9, eps=1e-8,
                         weight_decay=0, step=0)
    with pytest.raises(ValueError, match="shape"):
        optim.adamw_step(p, it.zeros(5), it.zeros(4), it.zeros(4), lr=1, beta1=0.9, beta2=0.9, eps=1e-8,
                         weight_decay=0, step=1)
    with pytest.raises(ValueError, match="momentum buffer"):
        optim.sgd_step(p, it.zeros(4), None, lr=0.1, momentum=0.9)
