"""Differential test of the public API against PyTorch: random cases drawn from a seed over
the ops (elementwise with broadcasting and scalars on either side, reductions, matmul with
transposed/sliced/expanded operands, shape ops, indexing, NN functionals, autocast), forward
values and every input's gradient compared with PyTorch computing in float64 on the same
float32 inputs. Tolerances are fixed per dtype up front. A failing case prints a one-line
reproducer; INFINITRAIN_DIFF_SEED / INFINITRAIN_DIFF_CASES pick other seeds locally."""
import os

import ml_dtypes
import numpy as np
import pytest

import infinitrain as it
import infinitrain.nn.functional as F

torch = pytest.importorskip("torch")

SEED = int(os.environ.get("INFINITRAIN_DIFF_SEED", "20261122"))
CASES = int(os.environ.get("INFINITRAIN_DIFF_CASES", "400"))
TOL = {"float32": dict(rtol=2e-4, atol=2e-5), "bfloat16": dict(rtol=2e-2, atol=2e-2)}


def _shape(rng, ndim=None):
    ndim = int(rng.integers(0, 4)) if ndim is None else ndim
    return tuple(int(n) for n in rng.integers(1, 5, size=ndim))


def _broadcastable(rng, shape):
    """A shape that broadcasts against `shape` (some dims 1, maybe fewer dims)."""
    drop = int(rng.integers(0, len(shape) + 1))
    return tuple(1 if rng.random() < 0.3 else n for n in shape[drop:])


UNARY = {"exp": (lambda x: x.exp(), lambda x: x.exp(), False),
         "log": (lambda x: x.log(), lambda x: x.log(), True),
         "sqrt": (lambda x: x.sqrt(), lambda x: x.sqrt(), True),
         "rsqrt": (lambda x: x.rsqrt(), lambda x: x.rsqrt(), True),
         "tanh": (lambda x: x.tanh(), lambda x: x.tanh(), False),
         "sigmoid": (lambda x: x.sigmoid(), lambda x: x.sigmoid(), False),
         "relu": (lambda x: x.relu(), lambda x: x.relu(), False),
         "abs": (lambda x: x.abs(), lambda x: x.abs(), False),
         "sin": (lambda x: x.sin(), lambda x: x.sin(), False),
         "square": (lambda x: x.square(), lambda x: x.square(), False),
         "neg": (lambda x: -x, lambda x: -x, False),
         "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"),
                       lambda x: torch.nn.functional.gelu(x, approximate="tanh"), False),
         "gelu": (lambda x: F.gelu(x), lambda x: torch.nn.functional.gelu(x), False),
         "silu": (lambda x: F.silu(x), lambda x: torch.nn.functional.silu(x), False),
         "softmax": (lambda x: x.softmax(-1), lambda x: x.softmax(-1), False),
         "log_softmax": (lambda x: x.log_softmax(-1), lambda x: x.log_softmax(-1), False),
         "clamp": (lambda x: x.clamp(-0.5, 0.7), lambda x: x.clamp(-0.5, 0.7), False)}

BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
          "div": lambda a, b: a / b, "pow": lambda a, b: a ** b,
          "maximum": lambda a, b: a.maximum(b) if hasattr(a, "maximum") else np.maximum(a, b),
          "minimum": lambda a, b: a.minimum(b) if hasattr(a, "minimum") else np.minimum(a, b)}


def _case(rng, i):
    """One random case: (name, inputs as float32 arrays, fn over (module, tensors))."""
    kind = rng.choice(["unary", "binary", "scalar", "reduce", "matmul", "shape", "index", "nn"])
    if kind == "unary":
        name = str(rng.choice(sorted(UNARY)))
        ours, theirs, positive = UNARY[name]
        shape = _shape(rng, int(rng.integers(1, 4)))
        x = rng.normal(size=shape)
        if positive:
            x = np.abs(x) + 0.5
        return name, [x], lambda m, t: (ours if m is it else theirs)(t[0])
    if kind in ("binary", "scalar"):
        name = str(rng.choice(sorted(BINARY)))
        fn = BINARY[name]
        shape = _shape(rng, int(rng.integers(1, 4)))
        a = rng.normal(size=shape)
        if name == "pow":
            a = np.abs(a) + 0.5
        if name == "div":
            a = a  # numerator any sign
        if kind == "binary":
            b = rng.normal(size=_broadcastable(rng, shape))
            if name == "div":
                b = np.sign(b) * (np.abs(b) + 0.5)
            if rng.random() < 0.5:
                return f"{name}(tensor, tensor)", [a, b], lambda m, t: fn(t[0], t[1])
            if name in ("maximum", "minimum", "pow"):
                return f"{name}(tensor, tensor)", [a, b], lambda m, t: fn(t[0], t[1])
            return f"{name}(rev)", [b, a], lambda m, t: fn(t[1], t[0]) if name not in ("div",) else fn(t[0], t[1])
        s = float(rng.choice([2.0, -1.5, 0.5, 3.0]))
        if name in ("maximum", "minimum"):
            return f"clamp_scalar({s})", [a], lambda m, t: t[0].clamp(min=s) if name == "maximum" else t[0].clamp(max=s)
        if name == "pow":
            return f"pow(tensor, {s})", [a], lambda m, t: t[0] ** s
        left = rng.random() < 0.5
        if name == "div" and left:
            a = np.sign(a) * (np.abs(a) + 0.5)
        np_s = rng.random() < 0.3
        sv = np.float32(s) if np_s else s
        return (f"{name}({'scalar, tensor' if left else 'tensor, scalar'}{', numpy' if np_s else ''})",
                [a], (lambda m, t: fn(sv, t[0])) if left else (lambda m, t: fn(t[0], sv)))
    if kind == "reduce":
        shape = _shape(rng, int(rng.integers(1, 4)))
        x = rng.normal(size=shape)
        ndim = len(shape)
        dims = tuple(sorted(rng.choice(ndim, size=int(rng.integers(1, ndim + 1)), replace=False).tolist()))
        keep = bool(rng.random() < 0.5)
        op = str(rng.choice(["sum", "mean", "amax", "max_dim", "logsumexp", "var", "std", "min_all", "cumsum"]))
        if op == "sum":
            return f"sum{dims},keep={keep}", [x], lambda m, t: t[0].sum(dims, keepdim=keep)
        if op == "mean":
            return f"mean{dims},keep={keep}", [x], lambda m, t: t[0].mean(dims, keepdim=keep)
        if op == "amax":
            return f"amax{dims}", [x], lambda m, t: t[0].amax(dims, keepdim=keep)
        if op == "max_dim":
            return f"max(dim={dims[0]})", [x], lambda m, t: t[0].max(dims[0], keepdim=keep)[0]
        if op == "logsumexp":
            return f"logsumexp{dims}", [x], lambda m, t: t[0].logsumexp(dims, keepdim=keep)
        if op == "var":
            if np.prod([shape[d] for d in dims]) < 2:
                dims = None
            return f"var({dims})", [x], lambda m, t: t[0].var(dims)
        if op == "std":
            x = x + 0.0
            return "std()", [x], lambda m, t: t[0].std() if x.size > 1 else t[0].sum()
        if op == "min_all":
            return "min()", [x], lambda m, t: t[0].min()
        return f"cumsum({dims[0]})", [x], lambda m, t: t[0].cumsum(dims[0])
    if kind == "matmul":
        mm, k, n = (int(v) for v in rng.integers(1, 6, size=3))
        batch = _shape(rng, int(rng.integers(0, 3)))
        variant = str(rng.choice(["plain", "a_T", "b_T", "slice", "expand", "vec"]))
        if variant == "plain":
            return "matmul", [rng.normal(size=batch + (mm, k)), rng.normal(size=(k, n))], lambda m, t: t[0] @ t[1]
        if variant == "a_T":
            return "matmul(a.mT)", [rng.normal(size=batch + (k, mm)), rng.normal(size=batch + (k, n))], \
                lambda m, t: t[0].transpose(-1, -2) @ t[1]
        if variant == "b_T":
            return "matmul(b.T)", [rng.normal(size=(mm, k)), rng.normal(size=(n, k))], lambda m, t: t[0] @ t[1].t()
        if variant == "slice":
            return "matmul(sliced)", [rng.normal(size=(mm, k + 2)), rng.normal(size=(k, n))], \
                lambda m, t: t[0][:, 1:k + 1] @ t[1]
        if variant == "expand":
            return "matmul(expanded)", [rng.normal(size=(1, mm, k)), rng.normal(size=(3, k, n))], \
                lambda m, t: t[0].expand(3, mm, k) @ t[1]
        return "matmul(vec)", [rng.normal(size=(k,)), rng.normal(size=batch + (k, n))], lambda m, t: t[0] @ t[1]
    if kind == "shape":
        shape = _shape(rng, 3)
        x = rng.normal(size=shape)
        op = str(rng.choice(["permute", "reshape", "slice", "cat", "stack", "squeeze", "tril", "narrow"]))
        if op == "permute":
            return "permute(2,0,1)", [x], lambda m, t: t[0].permute(2, 0, 1) * 2
        if op == "reshape":
            return "transpose.reshape", [x], lambda m, t: t[0].transpose(0, 2).reshape(-1) * 1.5
        if op == "slice":
            return "slice[...,::2]", [x], lambda m, t: t[0][..., ::2] * t[0][..., ::2]
        if op == "cat":
            y = rng.normal(size=shape)
            return "cat(dim=1)", [x, y], lambda m, t: m.cat([t[0], t[1] * 2], 1)
        if op == "stack":
            return "stack(dim=-1)", [x], lambda m, t: m.stack([t[0], t[0].exp()], -1)
        if op == "squeeze":
            return "unsqueeze.squeeze", [x], lambda m, t: t[0].unsqueeze(1).squeeze(1).sin()
        if op == "tril":
            return "tril(-1)", [x], lambda m, t: m.tril(t[0], -1)
        return "narrow", [x], lambda m, t: t[0].narrow(-1, 0, max(1, shape[-1] - 1)).exp()
    if kind == "index":
        shape = _shape(rng, 2)
        x = rng.normal(size=shape)
        op = str(rng.choice(["where", "masked_fill", "gather", "index_select", "getitem", "topk"]))
        if op == "where":
            y = rng.normal(size=shape)
            return "where(x > y)", [x, y], lambda m, t: m.where(t[0] > t[1], t[0], t[1] * 3)
        if op == "masked_fill":
            return "masked_fill(x < 0)", [x], lambda m, t: t[0].masked_fill(t[0] < 0, 0.5) * t[0]
        idx = rng.integers(0, shape[1], size=(shape[0], 3))
        if op == "gather":
            return "gather(1)", [x], lambda m, t: t[0].gather(1, m.tensor(idx))
        sel = rng.integers(-shape[0], shape[0], size=4)
        if op == "index_select":
            pos = np.mod(sel, shape[0])
            return "index_select(0)", [x], lambda m, t: t[0].index_select(0, m.tensor(pos))
        if op == "getitem":
            return "x[index_tensor]", [x], lambda m, t: t[0][m.tensor(sel)]
        k = int(rng.integers(1, shape[1] + 1))
        return f"topk({k})", [x], lambda m, t: t[0].topk(k, -1)[0]
    # nn functionals
    op = str(rng.choice(["layer_norm", "cross_entropy", "mse", "nll", "linear", "autocast_linear",
                         "norm_of_expanded", "tied_embedding"]))
    n, c = (int(v) for v in rng.integers(2, 6, size=2))
    if op == "norm_of_expanded":  # a stride-0 input; rms_norm's default eps is its dtype's epsilon
        c = int(rng.integers(1, 6))
        lead = _shape(rng, int(rng.integers(1, 3)))
        src = tuple(1 if rng.random() < 0.5 else k for k in lead) + (c,)
        rms, ran_in = bool(rng.random() < 0.5), {}

        def norm(m, t):
            x = t[0].expand(*lead, c)
            if m is it:  # runs first: PyTorch's reference (in float64) takes the eps of our dtype
                ran_in["eps"] = float(ml_dtypes.finfo(t[0].dtype.numpy).eps)
                return F.rms_norm(x, (c,), t[1]) if rms else F.layer_norm(x, (c,), t[1], t[2])
            return torch.nn.functional.rms_norm(x, (c,), t[1], eps=ran_in["eps"]) if rms else \
                torch.nn.functional.layer_norm(x, (c,), t[1], t[2])
        return f"{'rms' if rms else 'layer'}_norm(expand{src}->{lead + (c,)})", \
            [rng.normal(size=src), rng.normal(size=(c,)), rng.normal(size=(c,))], norm
    if op == "tied_embedding":  # one weight reached twice: its two gradients summed
        vocab = int(rng.integers(2, 9))
        ids = rng.integers(0, vocab, size=int(rng.integers(1, 9)))
        return "tied_embedding", [rng.normal(size=(vocab, c))], \
            lambda m, t: (F if m is it else torch.nn.functional).embedding(m.tensor(ids), t[0]) @ t[0].T
    if op == "layer_norm":
        return "layer_norm", [rng.normal(size=(n, c)), rng.normal(size=(c,)), rng.normal(size=(c,))], \
            lambda m, t: (F if m is it else torch.nn.functional).layer_norm(t[0], (c,), t[1], t[2])
    tgt = rng.integers(0, c, size=n)
    if op == "cross_entropy":
        return "cross_entropy", [rng.normal(size=(n, c))], \
            lambda m, t: (F if m is it else torch.nn.functional).cross_entropy(t[0], m.tensor(tgt))
    if op == "nll":
        return "nll_loss(log_softmax)", [rng.normal(size=(n, c))], \
            lambda m, t: (F if m is it else torch.nn.functional).nll_loss(t[0].log_softmax(1), m.tensor(tgt))
    if op == "mse":
        return "mse_loss", [rng.normal(size=(n, c)), rng.normal(size=(n, c))], \
            lambda m, t: (F if m is it else torch.nn.functional).mse_loss(t[0], t[1])
    if op == "linear":
        return "linear", [rng.normal(size=(n, c)), rng.normal(size=(3, c)), rng.normal(size=(3,))], \
            lambda m, t: (F if m is it else torch.nn.functional).linear(t[0], t[1], t[2])
    return "autocast(bf16) linear", [rng.normal(size=(n, c)), rng.normal(size=(3, c))], "autocast"


def _run_ours(fn, arrays, dtype):
    ts = [it.tensor(a.astype(np.float32), dtype=dtype, requires_grad=True) for a in arrays]
    out = fn(it, ts)
    out.float().sum().backward() if out.dtype is not it.float32 else out.sum().backward()
    return (np.asarray(out.detach().float().numpy(), np.float64),
            [None if t.grad is None else np.asarray(t.grad.float().numpy(), np.float64) for t in ts])


def _run_torch(fn, arrays, dtype):
    rounded = [np.asarray(it.tensor(a.astype(np.float32), dtype=dtype).float().numpy(), np.float64)
               for a in arrays]
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in rounded]
    out = fn(torch, ts)
    out.sum().backward()
    return out.detach().numpy(), [None if t.grad is None else t.grad.numpy() for t in ts]


@pytest.mark.slow
def test_differential_against_pytorch():
    rng = np.random.default_rng(SEED)
    failures = []
    for i in range(CASES):
        name, arrays, fn = _case(rng, i)
        dtype = it.bfloat16 if rng.random() < 0.15 and name not in ("topk",) else it.float32
        tol = TOL[dtype.name]
        if fn == "autocast":
            def ours(m, t):
                with it.autocast("cpu", dtype=it.bfloat16):
                    return F.linear(t[0], t[1])
            theirs = lambda m, t: t[0] @ t[1].T  # noqa: E731
            dtype, tol = it.float32, TOL["bfloat16"]
        else:
            ours = theirs = fn
        try:
            got, got_grads = _run_ours(ours, arrays, dtype)
            want, want_grads = _run_torch(theirs, arrays, dtype)
            np.testing.assert_allclose(got, want, **tol, err_msg="forward")
            for j, (g, w) in enumerate(zip(got_grads, want_grads)):
                if w is None:
                    continue
                assert g is not None, f"input {j} got no gradient"
                np.testing.assert_allclose(g, w, **tol, err_msg=f"gradient of input {j}")
        except Exception as e:  # noqa: BLE001
            shapes = [a.shape for a in arrays]
            failures.append(f"INFINITRAIN_DIFF_SEED={SEED} case {i}: {name} dtype={dtype.name} "
                            f"shapes={shapes}: {type(e).__name__}: {str(e).splitlines()[0:6]}")
    assert not failures, f"{len(failures)} of {CASES} cases differ from PyTorch:\n" + "\n".join(failures)


@pytest.mark.slow
@pytest.mark.parametrize("make", [
    lambda m: m.zeros(2, 3) + m.zeros(4),
    lambda m: m.zeros(2, 3) @ m.zeros(2, 3),
    lambda m: m.cat([m.zeros(2, 3), m.zeros(3, 3)], 1),
    lambda m: m.zeros(2, 3).view(4),
    lambda m: m.zeros(2, 3).sum(2),
    lambda m: m.zeros(2, 3).permute(0, 0),
    lambda m: m.zeros(2, 3)[0, 0, 0],
    lambda m: m.zeros(2, 3).gather(1, m.tensor([[5]]).expand(2, 1)),
    lambda m: m.zeros(3).topk(4),
    lambda m: m.zeros(2).expand(3, 2).add_(1),
])
def test_errors_raise_in_both(make):
    with pytest.raises(Exception):
        make(torch)
    with pytest.raises(Exception):
        make(it)


def test_a_16_bit_embeddings_repeated_rows_are_summed_in_float32():
    """300 gradients of 1 into one bfloat16 row: summed in bfloat16 the row stops at 256 (256 + 1
    rounds back to 256), as PyTorch's CPU kernel gives; its CUDA kernel, and ours, sum in float32."""
    w = it.zeros(3, 2, dtype=it.bfloat16, requires_grad=True)
    F.embedding(it.zeros(300, dtype=it.int64), w).float().sum().backward()
    assert w.grad.dtype is it.bfloat16 and w.grad.float().tolist() == [[300.0, 300.0], [0.0, 0.0], [0.0, 0.0]]
