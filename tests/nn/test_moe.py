"""The mixture-of-experts layer (nn.moe): its output and every gradient (router, routed experts,
shared experts, input) against a PyTorch reference written here with a plain loop over the
experts, and against a plain loop over the experts in this package's own ops; the auxiliary
and z losses against their formulas, per sequence; the capacity's drop order; the selection
bias and its update; the refusals."""
from types import SimpleNamespace

import numpy as np
import pytest

import infinitrain as it
from infinitrain.models import LLaMA3Config
from infinitrain.nn.moe import MoE, aux_loss_scale, update_moe_biases
from infinitrain.nn.moe.router import capacity, capacity_keep
from infinitrain.ops.index import index_select

torch = pytest.importorskip("torch")
TOL = dict(rtol=1e-5, atol=1e-5)


def config(**kw):
    base = dict(block_size=32, vocab_size=300, n_layer=2, n_head=4, n_kv_head=2, n_embd=16,
                ffn_dim_multiplier=None, multiple_of=16, num_experts=4, moe_top_k=2, moe_ffn_hidden=8,
                moe_aux_loss_coeff=0.1, moe_z_loss_coeff=0.01)
    base.update(kw)
    return LLaMA3Config(**base)


def layer(cfg, seed=0):
    moe = MoE(cfg)
    rng = np.random.default_rng(seed)
    with it.no_grad():
        for p in moe.parameters():
            p.copy_(it.tensor(rng.standard_normal(tuple(p.shape)).astype(np.float32) * 0.5))
    return moe


def weights(moe):
    """The layer's weights as torch leaves: gate, [(gate_proj, up_proj, down_proj)], shared."""
    def leaf(p):
        return torch.tensor(p.detach().numpy(), requires_grad=True)
    experts = [tuple(leaf(getattr(moe.experts[str(e)], n).weight) for n in ("gate_proj", "up_proj", "down_proj"))
               for e in range(moe.num_experts)]
    shared = tuple(leaf(getattr(moe.shared_experts, n).weight) for n in ("gate_proj", "up_proj", "down_proj")) \
        if "shared_experts" in moe._modules else None
    return leaf(moe.gate.weight), experts, shared


def swiglu(x, wg, wu, wd):
    return (torch.nn.functional.silu(x @ wg.T) * (x @ wu.T)) @ wd.T


def kept_by_capacity(ids, cap, E):
    """The drop order written out: per sequence, first choices by position, then second choices..."""
    B, T, k = ids.shape
    keep = np.zeros(ids.shape, bool)
    for b in range(B):
        taken = np.zeros(E, int)
        for j in range(k):
            for t in range(T):
                e = ids[b, t, j]
                keep[b, t, j] = taken[e] < cap
                taken[e] += 1
    return keep


def reference(cfg, x, gate, experts, shared, bias=None):
    """PyTorch: (output, load-balancing loss, z loss), one expert at a time."""
    B, T, C = x.shape
    E, k = cfg.num_experts, cfg.moe_top_k
    flat = x.reshape(-1, C)
    logits = flat @ gate.T
    scores = torch.softmax(logits, -1) if cfg.moe_router == "softmax" else torch.sigmoid(logits)
    select = scores.detach() + (torch.tensor(bias) if bias is not None else 0)
    ids = select.topk(k, -1).indices
    w = scores.gather(1, ids)
    if cfg.moe_norm_topk_prob:
        w = w / w.sum(-1, keepdim=True)
    keep = np.ones((B, T, k), bool)
    if cfg.moe_capacity_factor is not None:
        keep = kept_by_capacity(ids.numpy().reshape(B, T, k), capacity(cfg.moe_capacity_factor, T, k, E), E)
    keep = torch.tensor(keep.reshape(-1, k))
    out = torch.zeros_like(flat)
    for e, (wg, wu, wd) in enumerate(experts):
        tok, choice = torch.nonzero((ids == e) & keep, as_tuple=True)
        out = out.index_add(0, tok, swiglu(flat[tok], wg, wu, wd) * w[tok, choice, None])
    if shared is not None:
        out = out + swiglu(flat, *shared)
    probs = scores.reshape(B, T, E)
    if cfg.moe_router == "sigmoid":
        probs = probs / probs.sum(-1, keepdim=True)
    counts = torch.stack([(ids.reshape(B, T, k) == e).sum((1, 2)) for e in range(E)], -1).float()
    f = counts / (k * T)
    P = probs.mean(1)
    lb = (E * (f * P).sum(-1)).mean()
    z = (torch.logsumexp(logits, -1).reshape(B, T) ** 2).mean(-1).mean()
    return out.reshape(B, T, C), lb, z


CASES = {
    "softmax": {},
    "top1 unnormalised": dict(moe_top_k=1, moe_norm_topk_prob=False),
    "sigmoid + shared": dict(moe_router="sigmoid", moe_shared_experts=2),
    "capacity": dict(moe_capacity_factor=0.5, moe_shared_experts=1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_layer_and_gradients_against_torch(case):
    cfg = config(**CASES[case])
    moe = layer(cfg)
    rng = np.random.default_rng(1)
    xa = rng.standard_normal((2, 6, cfg.n_embd)).astype(np.float32)
    r = rng.standard_normal(xa.shape).astype(np.float32)
    x = it.tensor(xa, requires_grad=True)
    y = moe(x)
    (y * it.tensor(r)).sum().backward()  # the auxiliary losses' gradients join in backward

    xt = torch.tensor(xa, requires_grad=True)
    gate, experts, shared = weights(moe)
    yt, lb, z = reference(cfg, xt, gate, experts, shared)
    ((yt * torch.tensor(r)).sum() + cfg.moe_aux_loss_coeff * lb + cfg.moe_z_loss_coeff * z).backward()

    np.testing.assert_allclose(y.detach().numpy(), yt.detach().numpy(), **TOL)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), **TOL)
    np.testing.assert_allclose(moe.gate.weight.grad.numpy(), gate.grad.numpy(), **TOL)
    for e, ws in enumerate(experts):
        for n, w in zip(("gate_proj", "up_proj", "down_proj"), ws):
            np.testing.assert_allclose(getattr(moe.experts[str(e)], n).weight.grad.numpy(), w.grad.numpy(), **TOL)
    if shared is not None:
        for n, w in zip(("gate_proj", "up_proj", "down_proj"), shared):
            np.testing.assert_allclose(getattr(moe.shared_experts, n).weight.grad.numpy(), w.grad.numpy(), **TOL)
    stats = update_moe_biases({0: moe})  # the logged losses are the formulas' values
    np.testing.assert_allclose(stats.aux_loss, lb.item(), **TOL)
    np.testing.assert_allclose(stats.z_loss, z.item(), **TOL)
    assert (stats.dropped[0] > 0) == (cfg.moe_capacity_factor is not None)


def test_layer_equals_a_loop_over_experts_in_our_ops():
    cfg = config(moe_aux_loss_coeff=0.0, moe_z_loss_coeff=0.0, moe_shared_experts=1)
    moe = layer(cfg)
    xa = np.random.default_rng(2).standard_normal((3, 5, cfg.n_embd)).astype(np.float32)
    x = it.tensor(xa, requires_grad=True)
    moe(x).sum().backward()
    grads = [p.grad.numpy().copy() for p in moe.parameters()]
    gx = x.grad.numpy().copy()
    moe.zero_grad()

    x2 = it.tensor(xa, requires_grad=True)
    flat = x2.reshape(-1, cfg.n_embd)
    scores = it.softmax(flat @ moe.gate.weight.t(), -1)
    w, ids = it.topk(scores, cfg.moe_top_k, -1)
    w = w / w.sum(-1, keepdim=True)
    out = moe.shared_experts(flat)
    ids_np = ids.numpy()
    for e in range(cfg.num_experts):
        tok, choice = np.nonzero(ids_np == e)
        if tok.size:
            y = moe.experts[str(e)](index_select(flat, 0, it.tensor(tok)))
            sel = index_select(w.reshape(-1), 0, it.tensor(tok * cfg.moe_top_k + choice)).reshape(-1, 1)
            out = it.index_add(out, 0, it.tensor(tok), y * sel)
    out.sum().backward()
    np.testing.assert_allclose(gx, x2.grad.numpy(), **TOL)
    for g, p in zip(grads, moe.parameters()):
        np.testing.assert_allclose(g, p.grad.numpy(), **TOL)


def test_capacity_drop_order():
    ids = np.array([[[0, 1], [0, 2], [1, 0], [0, 1]]])  # one sequence of 4 tokens, k = 2
    keep = capacity_keep(ids, 3, cap=2)
    # expert 0's queue: first choices of tokens 0, 1, 3, then token 2's second choice
    # expert 1's: token 2's first choice, then the second choices of tokens 0 and 3
    np.testing.assert_array_equal(keep, [[[1, 1], [1, 1], [1, 0], [0, 0]]])
    rng = np.random.default_rng(0)
    many = rng.integers(0, 5, (3, 20, 3))
    np.testing.assert_array_equal(capacity_keep(many, 5, 4), kept_by_capacity(many, 4, 5))
    assert capacity(1.25, 20, 2, 8) == 7  # ceil(1.25 * 20 * 2 / 8)


def test_aux_losses_are_per_sequence_so_micro_batching_keeps_the_gradient():
    cfg = config(moe_aux_loss_coeff=1.0, moe_z_loss_coeff=0.1)
    moe = layer(cfg)
    xa = np.random.default_rng(3).standard_normal((4, 6, cfg.n_embd)).astype(np.float32)
    moe(it.tensor(xa)).mean().backward()
    whole = moe.gate.weight.grad.numpy().copy()
    whole_stats = update_moe_biases({0: moe})
    moe.zero_grad()
    with aux_loss_scale(0.5):  # two micro-batches of two sequences, as TrainStep scales them
        for part in (xa[:2], xa[2:]):
            (moe(it.tensor(part)).mean() * 0.5).backward()
    np.testing.assert_allclose(moe.gate.weight.grad.numpy(), whole, **TOL)
    parts = update_moe_biases({0: moe})
    np.testing.assert_allclose(parts.aux_loss, whole_stats.aux_loss, **TOL)
    np.testing.assert_array_equal(parts.tokens_per_expert[0], whole_stats.tokens_per_expert[0])


def test_selection_bias_chooses_and_updates():
    cfg = config(moe_router="sigmoid", moe_bias_update_rate=0.01, moe_aux_loss_coeff=0.0, moe_z_loss_coeff=0.0)
    moe = layer(cfg)
    bias = moe.gate.e_score_correction_bias
    assert np.all(bias.numpy() == 0) and "gate.e_score_correction_bias" in moe.state_dict()
    x = it.tensor(np.random.default_rng(4).standard_normal((2, 8, cfg.n_embd)).astype(np.float32))
    moe(x)
    load = update_moe_biases({0: moe}).tokens_per_expert[0]
    assert load.sum() == 2 * 8 * 2
    np.testing.assert_allclose(bias.numpy(), 0.01 * np.sign(load.mean() - load), **TOL)
    bias.copy_(it.tensor(np.array([100.0, 0, 0, 0], np.float32)))  # expert 0 chosen by every token
    xa = x.numpy()
    xt = torch.tensor(xa)
    gate, experts, shared = weights(moe)
    y = moe(x)
    yt, _, _ = reference(cfg, xt, gate, experts, shared, bias=bias.numpy())
    np.testing.assert_allclose(y.detach().numpy(), yt.detach().numpy(), **TOL)  # weights: the scores
    assert update_moe_biases({0: moe}).tokens_per_expert[0][0] == 16


def test_recomputation_counts_once_and_keeps_gradients():
    from infinitrain.autograd.recompute import checkpoint
    cfg = config(moe_shared_experts=1)
    xa = np.random.default_rng(5).standard_normal((2, 6, cfg.n_embd)).astype(np.float32)
    grads, loads = [], []
    for mode in ("none", "selective", "full"):
        moe = layer(cfg)
        moe.recompute = mode == "selective"
        x = it.tensor(xa, requires_grad=True)
        y = checkpoint(moe, x) if mode == "full" else moe(x)
        y.sum().backward()
        grads.append([x.grad.numpy()] + [p.grad.numpy() for p in moe.parameters()])
        loads.append(update_moe_biases({0: moe}).tokens_per_expert[0])
    for g in grads[1:]:
        for a, b in zip(grads[0], g):
            np.testing.assert_allclose(a, b, **TOL)
    for load in loads[1:]:
        np.testing.assert_array_equal(load, loads[0])


def test_bf16_autocast_follows_fp32():
    cfg = config()
    moe = layer(cfg)
    x = it.tensor(np.random.default_rng(6).standard_normal((2, 6, cfg.n_embd)).astype(np.float32))
    want = moe(x).detach().numpy()
    with it.autocast("cpu", dtype=it.bfloat16):
        got = moe(x)
    assert got.dtype is it.bfloat16
    np.testing.assert_allclose(got.detach().float().numpy(), want, atol=0.15, rtol=0.05)


@pytest.mark.parametrize("kw, message", [
    (dict(moe_top_k=5), "moe_top_k (5) must not exceed num_experts (4)"),
    (dict(moe_capacity_factor=0.0), "moe_capacity_factor must be a finite number > 0"),
    (dict(moe_capacity_factor=-1.0), "got -1.0"),
    (dict(moe_router="relu"), "moe_router must be 'softmax' or 'sigmoid', got 'relu'"),
    (dict(moe_layer_freq=0), "moe_layer_freq must be an integer >= 1, got 0"),
    (dict(num_experts=-1), "num_experts must be an integer >= 0, got -1"),
    (dict(moe_aux_loss_coeff=-0.1), "moe_aux_loss_coeff must be a finite number >= 0"),
])
def test_bad_configuration(kw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config(**kw).validate()


def test_parallel_refusals():
    tp = SimpleNamespace(size=2, sequence_parallel=False, sequence_split=1)
    with pytest.raises(ValueError, match="need sequence parallelism"):
        MoE(config(), tp=tp)
    cp = SimpleNamespace(size=2)
    with pytest.raises(ValueError, match="--moe_capacity_factor 1.0 counts capacity per whole sequence"):
        MoE(config(moe_capacity_factor=1.0), cp=cp)
