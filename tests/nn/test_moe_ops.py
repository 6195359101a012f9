"""The mixture-of-experts kernels (native/src/cpu/moe.c through infinitrain/ops/moe.py): the
routing order against a stable argsort, and permute -> grouped linear -> weighted unpermute,
values and every gradient, against a plain PyTorch loop over tokens and their choices (fp32
1e-5; bf16 against PyTorch's bf16 within 1e-2); empty experts, one expert taking every token,
keep masks; hostile sizes refused with the library's message."""
import numpy as np
import pytest

import infinitrain as it
from infinitrain._native import ffi, lib
from infinitrain.ops import moe

torch = pytest.importorskip("torch")

TOKENS, K, C, F, E = 13, 2, 8, 6, 5


def routing(case, rng):
    """expert ids [TOKENS, K] (distinct per token) and a keep mask for each case."""
    if case == "one_expert":  # every token's first choice is expert 3; experts 0 and 4 get nothing
        ids = np.stack([np.full(TOKENS, 3), rng.integers(1, 3, TOKENS)], 1)
    else:
        ids = np.stack([rng.choice(E, K, replace=False) for _ in range(TOKENS)])
        if case == "empty":  # experts 1 and 4 receive nothing
            ids = np.stack([rng.choice([0, 2, 3], K, replace=False) for _ in range(TOKENS)])
    keep = rng.random((TOKENS, K)) > 0.3 if case == "keep" else np.ones((TOKENS, K), bool)
    if case == "all_dropped":
        keep[:] = False
    return ids.astype(np.int64), keep


def expected_order(ids, keep):
    flat, kept = ids.reshape(-1), keep.reshape(-1)
    slots = np.arange(flat.size)[kept]
    order = np.argsort(flat[kept], kind="stable")
    return slots[order] // ids.shape[1], slots[order], tuple(np.bincount(flat[kept], minlength=E))


@pytest.mark.parametrize("case", ["random", "empty", "one_expert", "keep", "all_dropped"])
def test_the_routing_order_is_a_stable_sort_by_expert(case):
    ids, keep = routing(case, np.random.default_rng(1))
    rows, slots, counts = expected_order(ids, keep)
    mask = it.tensor(keep) if case in ("keep", "all_dropped") else None
    for dtype in (it.int64, it.int32):
        got = moe.sort_by_expert(it.tensor(ids).to(dtype), E, mask)
        assert got.counts == counts and all(isinstance(c, int) for c in got.counts)
        assert got.rows.tolist() == rows.tolist() and got.slots.tolist() == slots.tolist()
        assert got.rows.dtype is it.int64 and got.slots.dtype is it.int64


def torch_loop(x, ws, ids, keep, gate):
    """out[t] = sum over t's kept choices j of gate[t, j] * x[t] @ W[ids[t, j]]^T."""
    rows = []
    for t in range(ids.shape[0]):
        acc = torch.zeros(ws[0].shape[0], dtype=x.dtype)
        for j in range(ids.shape[1]):
            if keep[t, j]:
                acc = acc + gate[t, j] * (x[t] @ ws[int(ids[t, j])].t())
        rows.append(acc)
    return torch.stack(rows)


def ours_layer(x, ws, ids, keep, gate, case):
    order = moe.sort_by_expert(it.tensor(ids), E, it.tensor(keep) if case in ("keep", "all_dropped") else None)
    xs = moe.permute(x, order.rows)
    h = moe.grouped_linear(xs, ws, order.counts)
    weights = gate.reshape(-1)[order.slots]
    return moe.unpermute(h, order.rows, weights, x.shape[0]), order


@pytest.mark.parametrize("case", ["random", "empty", "one_expert", "keep", "all_dropped"])
def test_the_layer_path_and_its_gradients_against_a_pytorch_loop(case):
    rng = np.random.default_rng(2)
    ids, keep = routing(case, rng)
    arrays = [rng.standard_normal((TOKENS, C))] + [rng.standard_normal((F, C)) for _ in range(E)] + \
        [rng.random((TOKENS, K))]
    ours = [it.tensor(a.astype(np.float32), requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a.astype(np.float32), requires_grad=True) for a in arrays]
    y, order = ours_layer(ours[0], ours[1:-1], ids, keep, ours[-1], case)
    ref = torch_loop(theirs[0], theirs[1:-1], ids, keep, theirs[-1])
    if case == "all_dropped":  # PyTorch's zeros depend on nothing: give backward a graph to walk
        ref = ref + 0 * theirs[-1].sum()
    np.testing.assert_allclose(y.detach().numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    g = rng.standard_normal((TOKENS, F)).astype(np.float32)
    (y * it.tensor(g)).sum().backward()
    (ref * torch.tensor(g)).sum().backward()
    for o, t in zip(ours, theirs):
        want = t.grad.numpy() if t.grad is not None else np.zeros(t.shape, np.float32)
        np.testing.assert_allclose(o.grad.numpy(), want, rtol=1e-5, atol=1e-5)
    for e, n in enumerate(order.counts):  # an expert without rows: a zero gradient, not None
        if n == 0:
            assert not ours[1 + e].grad.numpy().any()


def test_bfloat16_against_pytorchs_bfloat16():
    rng = np.random.default_rng(3)
    ids, keep = routing("random", rng)
    arrays = [rng.standard_normal((TOKENS, C)) * 0.5] + [rng.standard_normal((F, C)) * 0.5 for _ in range(E)] + \
        [rng.random((TOKENS, K))]
    ours = [it.tensor(a.astype(np.float32)).to(it.bfloat16).requires_grad_() for a in arrays]
    theirs = [torch.tensor(a.astype(np.float32)).to(torch.bfloat16).requires_grad_() for a in arrays]
    y, _ = ours_layer(ours[0], ours[1:-1], ids, keep, ours[-1], "random")
    ref = torch_loop(theirs[0], theirs[1:-1], ids, keep, theirs[-1])
    assert y.dtype is it.bfloat16
    np.testing.assert_allclose(y.float().detach().numpy(), ref.float().detach().numpy(), rtol=1e-2, atol=1e-2)
    g = (rng.standard_normal((TOKENS, F)) * 0.5).astype(np.float32)
    (y.float() * it.tensor(g)).sum().backward()
    (ref.float() * torch.tensor(g)).sum().backward()
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.grad.float().numpy(), t.grad.float().numpy(), rtol=1e-2, atol=2e-2)


def test_the_scatter_back_has_the_same_bits_on_any_thread_count():
    rng = np.random.default_rng(4)
    y = it.tensor(rng.standard_normal((3000, 64)).astype(np.float32))
    rows = it.tensor(rng.integers(0, 700, 3000))
    w = it.tensor(rng.random(3000).astype(np.float32))
    before = it.get_num_threads()
    try:
        it.set_num_threads(1)
        one = moe.unpermute(y, rows, w, 700).numpy().copy()
        it.set_num_threads(2)
        two = moe.unpermute(y, rows, w, 700).numpy()
    finally:
        it.set_num_threads(before)
    assert one.tobytes() == two.tobytes()


# ---- hostile input ---------------------------------------------------------------------
CPU = ffi.new("it_device *", [lib.IT_CPU, 0])[0]


def refused(status, *words):
    message = ffi.string(lib.it_last_error()).decode()
    assert status != lib.IT_OK and all(w in message for w in words), (status, message)


def test_hostile_sizes_are_refused_with_the_librarys_message():
    x, out, w0 = ffi.new("float[64]"), ffi.new("float[64]"), ffi.new("float[64]")
    w = ffi.new("void *[2]", [w0, ffi.NULL])

    def fwd(sizes, groups=2, rows=4, k=2, n=2, weights=w):
        return lib.it_moe_grouped_linear_forward(CPU, lib.IT_FLOAT32, out, x, weights,
                                                 ffi.new("int64_t[]", sizes), groups, rows, k, n)
    refused(fwd([3, -1]), "group 1 has -1 rows")
    refused(fwd([3, 0]), "sum to 3, not to the 4 rows")
    refused(fwd([2, 2]), "matrix of group 1 (2 rows) is NULL")
    assert fwd([4, 0]) == lib.IT_OK  # a NULL matrix for an expert without rows is fine
    refused(fwd([4, 0], groups=-1), "groups must be in [0, 2^58]")
    refused(fwd([4, 0], rows=2**40, k=2**40), "too large")
    refused(fwd([4, 0], weights=ffi.NULL), "NULL")
    refused(fwd([2**62, 2**62]), "group 0 has")  # the sum is never formed past the rows
    dws = ffi.new("void *[2]", [w[0], ffi.NULL])
    refused(lib.it_moe_grouped_linear_backward_weight(CPU, lib.IT_FLOAT32, dws, x, x, ffi.new("int64_t[]", [4, 0]),
                                                      2, 4, 2, 2), "group 1 (0 rows) is NULL")
    refused(lib.it_moe_grouped_linear_forward(CPU, lib.IT_INT32, out, x, w, ffi.new("int64_t[]", [4, 0]), 2, 4, 2, 2),
            "not supported")
    ids = ffi.new("int64_t[]", [0, 1, 7, 2])
    r, s, counts = ffi.new("int64_t[4]"), ffi.new("int64_t[4]"), ffi.new("int64_t[4]")
    refused(lib.it_moe_sort(CPU, r, s, counts, ids, ffi.NULL, 2, 2, 4), "expert id 7 (token 1, choice 0)")
    refused(lib.it_moe_sort(CPU, r, s, counts, ids, ffi.NULL, 2, 2, 0), "num_experts")
    refused(lib.it_moe_sort(CPU, r, s, counts, ids, ffi.NULL, 2**40, 2**40, 4), "too large")
    bad_rows = ffi.new("int64_t[]", [0, 5])
    refused(lib.it_moe_permute(CPU, lib.IT_FLOAT32, out, x, bad_rows, 2, 4, 2), "rows[1] = 5 outside [0, 4)")
    refused(lib.it_moe_unpermute(CPU, lib.IT_FLOAT32, out, x, ffi.NULL, bad_rows, 2, 4, 2), "rows[1] = 5")
    refused(lib.it_moe_unpermute(CPU, lib.IT_FLOAT32, out, x, ffi.NULL, ffi.NULL, 2, 4, 2), "rows is NULL")
    refused(lib.it_moe_unpermute_backward(CPU, lib.IT_FLOAT32, out, ffi.NULL, x, x, ffi.NULL, bad_rows, 2, 4, 2),
            "dy needs the weights")


def test_python_level_errors_name_the_values():
    x = it.randn(4, 3)
    ws = [it.randn(5, 3), it.randn(5, 3)]
    with pytest.raises(ValueError, match=r"counts \[3, 2\] must be >= 0 and sum to the input's 4 rows"):
        moe.grouped_linear(x, ws, [3, 2])
    with pytest.raises(ValueError, match=r"input must be \[rows, in_features\], got shape \(12,\)"):
        moe.grouped_linear(x.reshape(-1), ws, [2, 2])
    with pytest.raises(ValueError, match="2 weights but 3 counts"):
        moe.grouped_linear(x, ws, [1, 1, 2])
    with pytest.raises(ValueError, match=r"every weight must be \[out, 3\]"):
        moe.grouped_linear(x, [it.randn(5, 3), it.randn(5, 4)], [2, 2])
    with pytest.raises(IndexError, match=r"expert id 4 \(token 1, choice 1\) outside \[0, 4\)"):
        moe.sort_by_expert(it.tensor([[0, 1], [2, 4]]), 4)
    with pytest.raises(ValueError, match=r"keep must be a mask of the ids' shape \(1, 2\), got shape \(2,\)"):
        moe.sort_by_expert(it.tensor([[0, 1]]), 4, it.tensor([True, False]))
    with pytest.raises(TypeError, match="expert ids must be integers, got float32"):
        moe.sort_by_expert(it.tensor([[0.0, 1.0]]), 4)
    assert moe.sort_by_expert(it.tensor([[0, 1]]), 4, it.tensor([[1, 0]])).counts == (1, 0, 0, 0)
    with pytest.raises(ValueError, match="num_experts must be >= 1, got 0"):
        moe.sort_by_expert(it.tensor([[0, 1]]), 0)
