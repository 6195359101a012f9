"""General attention against PyTorch: F.scaled_dot_product_attention with bool and additive
masks of every broadcast shape, cross attention (L != S), PyTorch's top-left causal triangle,
grouped-query heads, [N, L, E] inputs, rows with every key masked out, and dropout on the
probabilities (its mask recomputed in the backward pass); nn.MultiheadAttention and the
Transformer modules with PyTorch's weights copied in."""
import numpy as np
import pytest

import infinitrain as it
from infinitrain import nn
from infinitrain.nn import functional as F

torch = pytest.importorskip("torch")
TF = torch.nn.functional


def _both(a):
    return it.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)


def _close(ours, theirs, tol=2e-6):
    np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=tol, atol=tol)


MASKS = {  # name: (mask shape, dtype) broadcast against [B=2, H=4, L=5, S=7]
    "none": None,
    "bool [L, S]": ((5, 7), bool),
    "bool key padding [B, 1, 1, S]": ((2, 1, 1, 7), bool),
    "bool per head [B, H, L, S]": ((2, 4, 5, 7), bool),
    "float [L, S]": ((5, 7), np.float32),
    "float [B, 1, L, S]": ((2, 1, 5, 7), np.float32),
}


CASES = [(m, False) for m in MASKS] + [("none", True)]  # PyTorch refuses a mask with is_causal


@pytest.mark.parametrize("mask,is_causal", CASES, ids=[m + (" causal" if c else "") for m, c in CASES])
@pytest.mark.parametrize("kv_heads", [4, 2], ids=["MHA", "GQA"])
def test_sdpa_equals_pytorchs_forward_and_backward(rng, mask, is_causal, kv_heads):
    B, H, L, S, D = 2, 4, 5, 7, 8
    q, k, v = (rng.standard_normal(s).astype(np.float32)
               for s in ((B, H, L, D), (B, kv_heads, S, D), (B, kv_heads, S, D)))
    g = rng.standard_normal((B, H, L, D)).astype(np.float32)
    m = None
    if MASKS[mask]:
        shape, dtype = MASKS[mask]
        m = rng.random(shape) > 0.3 if dtype is bool else rng.standard_normal(shape).astype(dtype)
    (qi, qt), (ki, kt), (vi, vt) = _both(q), _both(k), _both(v)
    kw = dict(is_causal=is_causal, enable_gqa=kv_heads != H)
    oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=None if m is None else it.tensor(m), **kw)
    ot = TF.scaled_dot_product_attention(qt, kt, vt, attn_mask=None if m is None else torch.tensor(m), **kw)
    (oi * it.tensor(g)).sum().backward()
    (ot * torch.tensor(g)).sum().backward()
    for ours, theirs in ((oi, ot), (qi.grad, qt.grad), (ki.grad, kt.grad), (vi.grad, vt.grad)):
        _close(ours, theirs)


def test_sdpa_on_three_dimensional_inputs_with_a_scale(rng):
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((3, 4, 8), (3, 6, 8), (3, 6, 8)))
    m = rng.random((3, 4, 6)) > 0.2
    ours = F.scaled_dot_product_attention(it.tensor(q), it.tensor(k), it.tensor(v), it.tensor(m), scale=0.3)
    theirs = TF.scaled_dot_product_attention(torch.tensor(q), torch.tensor(k), torch.tensor(v), torch.tensor(m),
                                             scale=0.3)
    _close(ours, theirs)


def test_a_row_with_every_key_masked_out_gives_zeros_and_no_gradient(rng):
    """PyTorch's fused kernels give zeros (its math path NaN); never NaN here."""
    q, k, v = (rng.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3))
    m = np.ones((3, 3), bool)
    m[1] = False
    (qi, qt), (ki, kt), (vi, vt) = _both(q), _both(k), _both(v)
    oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=it.tensor(m))
    ot = TF.scaled_dot_product_attention(qt, kt, vt, attn_mask=torch.tensor(m))
    oi.sum().backward()
    ot.sum().backward()
    out = oi.detach().numpy()
    assert not np.isnan(out).any() and np.all(out[:, :, 1] == 0)
    for ours, theirs in ((oi, ot), (qi.grad, qt.grad), (ki.grad, kt.grad), (vi.grad, vt.grad)):
        _close(ours, theirs)


@pytest.mark.parametrize("L,S", [(16, 32), (130, 140)])  # one query block of 64 rows, and three
def test_dropout_on_the_probabilities_is_the_same_mask_forward_and_backward(rng, L, S):
    """With values the identity, the output is the dropped probabilities P' themselves: the
    kept share is about 1 - p and every kept one is P / (1 - p). Then the gradients equal
    PyTorch's attention with that very mask applied by hand, so the backward pass recomputed
    the forward's mask; the same seed gives the same mask, another seed another."""
    B, H, p = 2, 3, 0.3
    q, k = (rng.standard_normal((B, H, n, S)).astype(np.float32) for n in (L, S))
    eye = np.broadcast_to(np.eye(S, dtype=np.float32), (B, H, S, S)).copy()
    it.manual_seed(5)
    dropped = F.scaled_dot_product_attention(it.tensor(q), it.tensor(k), it.tensor(eye), dropout_p=p).numpy()
    probs = TF.softmax(torch.tensor(q) @ torch.tensor(k).transpose(-1, -2) / S ** 0.5, -1).numpy()
    keep = dropped != 0
    assert abs(keep.mean() - (1 - p)) < 0.03
    np.testing.assert_allclose(dropped[keep], probs[keep] / (1 - p), rtol=1e-5)
    it.manual_seed(5)
    again = F.scaled_dot_product_attention(it.tensor(q), it.tensor(k), it.tensor(eye), dropout_p=p).numpy()
    assert np.array_equal(again, dropped)
    assert not np.array_equal(F.scaled_dot_product_attention(it.tensor(q), it.tensor(k), it.tensor(eye),
                                                             dropout_p=p).numpy() != 0, keep)
    v = rng.standard_normal((B, H, S, S)).astype(np.float32)
    (qi, qt), (ki, kt), (vi, vt) = _both(q), _both(k), _both(v)
    it.manual_seed(5)
    oi = F.scaled_dot_product_attention(qi, ki, vi, dropout_p=p)
    ot = (TF.softmax(qt @ kt.transpose(-1, -2) / S ** 0.5, -1) * torch.tensor(keep) / (1 - p)) @ vt
    (oi ** 2).sum().backward()
    (ot ** 2).sum().backward()
    for ours, theirs in ((oi, ot), (qi.grad, qt.grad), (ki.grad, kt.grad), (vi.grad, vt.grad)):
        _close(ours, theirs, 1e-5)


def test_sdpa_refuses_what_pytorch_refuses_and_says_what_is_not_implemented():
    q = it.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match="not both"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=it.ones(3, 3, dtype=it.bool), is_causal=True)
    with pytest.raises(ValueError, match="does not broadcast"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=it.ones(2, 5, dtype=it.bool))
    with pytest.raises(ValueError, match="dropout_p"):
        F.scaled_dot_product_attention(q, q, q, dropout_p=1.5)
    with pytest.raises(ValueError, match="enable_gqa"):
        F.scaled_dot_product_attention(q, it.zeros(1, 1, 3, 4), it.zeros(1, 1, 3, 4))
    with pytest.raises(NotImplementedError, match="head size"):
        F.scaled_dot_product_attention(q, q, it.zeros(1, 2, 3, 5))
    with pytest.raises(NotImplementedError, match="requires grad"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=it.zeros(3, 3, requires_grad=True))
    with pytest.raises(TypeError, match="bool or floating"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=it.zeros(3, 3, dtype=it.int64))


# ---- modules: PyTorch's weights copied in, outputs and every gradient compared --------------

def _copy_weights(ours, theirs):
    """theirs' state_dict into ours, by PyTorch's names (the names must all match)."""
    state = {k: it.tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()}
    assert set(state) == set(ours.state_dict()), set(state) ^ set(ours.state_dict())
    ours.load_state_dict(state)


def _grads_close(ours, theirs, tol):
    t = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), t[name].grad.numpy(), rtol=tol, atol=tol, err_msg=name)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_multihead_attention_equals_pytorchs(rng, batch_first, need_weights, cross):
    E, H, L, S, N = 16, 4, 5, (7 if cross else 5), 3
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(E, H, batch_first=batch_first)
    ours = nn.MultiheadAttention(E, H, batch_first=batch_first)
    _copy_weights(ours, theirs)
    shape = (lambda T: (N, T, E)) if batch_first else (lambda T: (T, N, E))
    x = rng.standard_normal(shape(L)).astype(np.float32)
    mem = rng.standard_normal(shape(S)).astype(np.float32) if cross else x
    pad = rng.random((N, S)) < 0.3
    pad[:, 0] = False  # every query keeps a key: PyTorch's weights path gives NaN otherwise
    causal = np.triu(np.ones((L, S), bool), 1)
    (xi, xt), (mi, mt) = _both(x), _both(mem)
    args_i = (xi, mi, mi) if cross else (xi, xi, xi)
    args_t = (xt, mt, mt) if cross else (xt, xt, xt)
    oi, wi = ours(*args_i, key_padding_mask=it.tensor(pad), attn_mask=it.tensor(causal), need_weights=need_weights)
    ot, wt = theirs(*args_t, key_padding_mask=torch.tensor(pad), attn_mask=torch.tensor(causal),
                    need_weights=need_weights)
    _close(oi, ot, 1e-5)
    assert (wi is None) == (wt is None)
    if wt is not None:
        _close(wi, wt, 1e-5)
    (oi ** 2).sum().backward()
    (ot ** 2).sum().backward()
    _grads_close(ours, theirs, 1e-4)
    _close(xi.grad, xt.grad, 1e-4)


def test_multihead_attention_unbatched_with_float_and_per_head_masks(rng):
    E, H, L = 8, 2, 4
    torch.manual_seed(1)
    theirs, ours = torch.nn.MultiheadAttention(E, H), nn.MultiheadAttention(E, H)
    _copy_weights(ours, theirs)
    x = rng.standard_normal((L, E)).astype(np.float32)
    m = rng.standard_normal((L, L)).astype(np.float32)
    oi, wi = ours(it.tensor(x), it.tensor(x), it.tensor(x), attn_mask=it.tensor(m), average_attn_weights=False)
    ot, wt = theirs(torch.tensor(x), torch.tensor(x), torch.tensor(x), attn_mask=torch.tensor(m),
                    average_attn_weights=False)
    _close(oi, ot, 1e-5)
    _close(wi, wt, 1e-5)
    xb = rng.standard_normal((L, 3, E)).astype(np.float32)
    per_head = rng.random((3 * H, L, L)) < 0.3
    per_head[:, :, 0] = False
    oi = ours(*(it.tensor(xb),) * 3, attn_mask=it.tensor(per_head), need_weights=False)[0]
    ot = theirs(*(torch.tensor(xb),) * 3, attn_mask=torch.tensor(per_head), need_weights=False)[0]
    _close(oi, ot, 1e-5)
    with pytest.raises(ValueError, match="key_padding_mask must be"):
        ours(*(it.tensor(xb),) * 3, key_padding_mask=it.zeros(2, L, dtype=it.bool))
    with pytest.raises(ValueError, match="multiple of num_heads"):
        nn.MultiheadAttention(10, 3)


@pytest.mark.filterwarnings("ignore::UserWarning")  # PyTorch's, on a float causal mask beside bool padding
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_the_transformer_equals_pytorchs(rng, norm_first, activation):
    """nn.Transformer (2 encoder, 2 decoder layers) in eval mode, batch_first, with PyTorch's
    causal target mask and key-padding masks on source, target and memory: output and every
    parameter's gradient."""
    d, H, N, S, T = 16, 4, 2, 6, 5
    torch.manual_seed(2)
    kw = dict(d_model=d, nhead=H, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=32,
              dropout=0.1, activation=activation, batch_first=True, norm_first=norm_first)
    theirs, ours = torch.nn.Transformer(**kw).eval(), nn.Transformer(**kw).eval()
    _copy_weights(ours, theirs)
    src, tgt = rng.standard_normal((N, S, d)).astype(np.float32), rng.standard_normal((N, T, d)).astype(np.float32)
    src_pad = np.zeros((N, S), bool)
    src_pad[1, -2:] = True
    tgt_pad = np.zeros((N, T), bool)
    tgt_pad[0, -1] = True
    (si, st), (ti, tt) = _both(src), _both(tgt)
    oi = ours(si, ti, tgt_mask=nn.Transformer.generate_square_subsequent_mask(T),
              src_key_padding_mask=it.tensor(src_pad), tgt_key_padding_mask=it.tensor(tgt_pad),
              memory_key_padding_mask=it.tensor(src_pad))
    ot = theirs(st, tt, tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(T),
                src_key_padding_mask=torch.tensor(src_pad), tgt_key_padding_mask=torch.tensor(tgt_pad),
                memory_key_padding_mask=torch.tensor(src_pad))
    _close(oi, ot, 2e-5)
    (oi ** 2).sum().backward()
    (ot ** 2).sum().backward()
    _grads_close(ours, theirs, 2e-4)
    _close(si.grad, st.grad, 2e-4)


def test_encoder_layers_start_as_copies_and_train_apart():
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16)
    enc = nn.TransformerEncoder(layer, 3)
    a, b = enc.layers[0].linear1.weight, enc.layers[2].linear1.weight
    assert np.array_equal(a.detach().numpy(), b.detach().numpy()) and a.data_ptr() != b.data_ptr()
    assert len(list(enc.parameters())) == 3 * len(list(layer.parameters()))


def test_a_transformer_in_training_mode_drops_out_and_learns(rng):
    """Dropout in attention and in every block: two forward passes differ in training mode and
    agree in eval mode; a few SGD steps copy a sequence (the loss falls)."""
    it.manual_seed(0)
    model = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                           dim_feedforward=32, dropout=0.2, batch_first=True)
    src = it.tensor(rng.standard_normal((4, 6, 16)).astype(np.float32))
    mask = nn.Transformer.generate_square_subsequent_mask(6)
    assert not np.array_equal(model(src, src, tgt_mask=mask).detach().numpy(),
                              model(src, src, tgt_mask=mask).detach().numpy())
    model.eval()
    assert np.array_equal(model(src, src).detach().numpy(), model(src, src).detach().numpy())
    model.train()
    opt = it.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = ((model(src, src, tgt_mask=mask) - src) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses


def test_recomputed_layers_give_the_same_gradients(rng):
    """TransformerEncoder/Decoder layers with .recompute = True (dropout on) rerun in backward
    with the same random numbers: the decoder's gradients bit-identical, the encoder's equal
    up to the order in which the decoder layers' memory gradients are summed (1e-14)."""
    src = it.tensor(rng.standard_normal((2, 5, 16)).astype(np.float32))
    grads = []
    for recompute in (False, True):
        it.manual_seed(3)
        model = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
                               dim_feedforward=32, dropout=0.3, batch_first=True)
        for layer in [*model.encoder.layers, *model.decoder.layers]:
            layer.recompute = recompute
        (model(src, src) ** 2).sum().backward()
        grads.append([(n, p.grad.numpy().copy()) for n, p in model.named_parameters()])
    for (name, a), (_, b) in zip(*grads):
        if name.startswith("decoder"):
            assert np.array_equal(a, b), name
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("kdim,vdim,add_bias_kv,add_zero_attn", [
    (12, 10, False, False), (None, None, True, False), (None, None, False, True), (12, 20, True, True)])
def test_multihead_attention_options_equal_pytorchs(rng, kdim, vdim, add_bias_kv, add_zero_attn):
    """kdim/vdim (separate q/k/v projection weights), add_bias_kv and add_zero_attn (a key each
    query may attend to, the masks widened to match), under PyTorch's parameter names."""
    E, H, L, S, N = 16, 4, 5, 7, 3
    options = dict(kdim=kdim, vdim=vdim, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
    torch.manual_seed(2)
    theirs, ours = torch.nn.MultiheadAttention(E, H, **options), nn.MultiheadAttention(E, H, **options)
    assert sorted(n for n, _ in ours.named_parameters()) == sorted(n for n, _ in theirs.named_parameters())
    _copy_weights(ours, theirs)
    q = rng.standard_normal((L, N, E)).astype(np.float32)
    k = rng.standard_normal((S, N, kdim or E)).astype(np.float32)
    v = rng.standard_normal((S, N, vdim or E)).astype(np.float32)
    pad = rng.random((N, S)) < 0.3
    pad[:, 0] = False
    mask = rng.standard_normal((L, S)).astype(np.float32)
    (qi, qt), (ki, kt), (vi, vt) = _both(q), _both(k), _both(v)
    oi, wi = ours(qi, ki, vi, key_padding_mask=it.tensor(pad), attn_mask=it.tensor(mask))
    ot, wt = theirs(qt, kt, vt, key_padding_mask=torch.tensor(pad), attn_mask=torch.tensor(mask))
    _close(oi, ot, 1e-5)
    _close(wi, wt, 1e-5)
    (oi ** 2).sum().backward()
    (ot ** 2).sum().backward()
    _grads_close(ours, theirs, 1e-4)
    for a, b in ((qi, qt), (ki, kt), (vi, vt)):
        _close(a.grad, b.grad, 1e-4)
    if kdim:
        with pytest.raises(ValueError, match="kdim 12"):
            ours(qi, qi, vi)
