"""Elementwise, reduction and matmul kernels against numpy, in float32 and bfloat16."""
import numpy as np
import pytest

import infinitrain as it
from infinitrain._native import lib
from infinitrain.kernels import elementwise as ew
from helpers import bf16_round, mpirun, numerical_grad, to_np

SIZES = [1, 7, 31, 2048, 2049, 10007]
DTYPES = [it.float32, it.bfloat16]


def make(a: np.ndarray, dtype):
    """A tensor of dtype from a, and the float32 reference values it actually holds."""
    if dtype is it.bfloat16:
        return it.tensor(a, dtype=it.bfloat16), bf16_round(a)
    return it.tensor(a, dtype=dtype), a.astype(np.float32)


def tol(dtype, f32=(1e-6, 1e-6)):
    return dict(rtol=1e-2, atol=1e-2) if dtype is it.bfloat16 else dict(rtol=f32[0], atol=f32[1])


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


UNARY = {
    lib.IT_NEG: (np.negative, None), lib.IT_EXP: (np.exp, None), lib.IT_LOG: (np.log, "pos"),
    lib.IT_SQRT: (np.sqrt, "pos"), lib.IT_RSQRT: (lambda x: 1 / np.sqrt(x), "pos"),
    lib.IT_ABS: (np.abs, None), lib.IT_TANH: (np.tanh, None), lib.IT_SIGMOID: (sigmoid, None),
    lib.IT_RELU: (lambda x: np.maximum(x, 0), None), lib.IT_SILU: (lambda x: x * sigmoid(x), None),
    lib.IT_GELU_TANH: (gelu, None), lib.IT_SIN: (np.sin, None), lib.IT_COS: (np.cos, None),
    lib.IT_SQUARE: (np.square, None), lib.IT_RECIPROCAL: (np.reciprocal, "pos"),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op, n, dtype, rng):
    ref, domain = UNARY[op]
    a = rng.standard_normal(n).astype(np.float32) * 3
    if domain == "pos":
        a = np.abs(a) + 0.1
    t, a = make(a, dtype)
    out = ew.unary(op, t)
    assert out.dtype is dtype and out.shape == (n,)
    np.testing.assert_allclose(to_np(out), ref(a.astype(np.float64)), **tol(dtype, (2e-6, 1e-6)))


def test_exp_special_values():
    x = it.tensor([-np.inf, -100.0, 0.0, 88.0, 89.0, np.inf, np.nan])
    y = x.exp().numpy()
    assert y[0] == 0 and y[1] == 0 and y[2] == 1 and np.isfinite(y[3])
    assert np.isinf(y[4]) and np.isinf(y[5]) and np.isnan(y[6])


BACKWARD_SAVES_OUTPUT = {lib.IT_EXP, lib.IT_SQRT, lib.IT_TANH, lib.IT_SIGMOID}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_backward_numerical(op, rng):
    ref, domain = UNARY[op]
    a = rng.standard_normal(37) * 2
    if domain == "pos":
        a = np.abs(a) + 0.5
    if op in (lib.IT_RELU, lib.IT_ABS):
        a = a + np.sign(a) * 0.05  # keep clear of the kink
    g = rng.standard_normal(37)
    expected = numerical_grad(lambda x: np.sum(ref(x) * g), a)
    x = it.tensor(a.astype(np.float32))
    saved = ew.unary(op, x) if op in BACKWARD_SAVES_OUTPUT else x
    got = ew.unary_backward(op, it.tensor(g.astype(np.float32)), saved)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-4)


BINARY = {lib.IT_ADD: np.add, lib.IT_SUB: np.subtract, lib.IT_MUL: np.multiply,
          lib.IT_DIV: np.divide, lib.IT_MAXIMUM: np.maximum, lib.IT_MINIMUM: np.minimum,
          lib.IT_POW: np.power}
SHAPES = [((5,), (5,)), ((3, 1), (1, 4)), ((2, 3, 7), (7,)), ((2, 3, 7), (3, 1)),
          ((1,), (4, 2049)), ((4, 1, 5), (1, 3, 1)), ((), (3,))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_broadcast(op, shapes, dtype, rng):
    a = rng.standard_normal(shapes[0]).astype(np.float32)
    b = rng.standard_normal(shapes[1]).astype(np.float32)
    if op == lib.IT_POW:
        a = np.abs(a) + 0.5
    ta, a = make(a, dtype)
    tb, b = make(b, dtype)
    out = ew.binary(op, ta, tb)
    expected = BINARY[op](a, b)
    assert out.shape == expected.shape
    np.testing.assert_allclose(to_np(out), expected, **tol(dtype, (2e-6, 1e-6)))


def test_binary_strided_operands(rng):
    a = rng.standard_normal((6, 5)).astype(np.float32)
    b = rng.standard_normal((5, 6)).astype(np.float32)
    out = it.from_numpy(a)[::2] + it.from_numpy(b).t()[::2]
    np.testing.assert_allclose(out.numpy(), a[::2] + b.T[::2])


@pytest.mark.parametrize("dtype", [it.int32, it.int64])
def test_integer_binary(dtype, rng):
    a = rng.integers(-100, 100, (4, 5))
    b = rng.integers(-100, 100, (5,))
    ta, tb = it.tensor(a, dtype=dtype), it.tensor(b, dtype=dtype)
    for op, ref in [(lib.IT_ADD, np.add), (lib.IT_SUB, np.subtract), (lib.IT_MUL, np.multiply),
                    (lib.IT_MAXIMUM, np.maximum), (lib.IT_MINIMUM, np.minimum)]:
        np.testing.assert_array_equal(ew.binary(op, ta, tb).numpy(), ref(a, b))
    with pytest.raises(NotImplementedError, match="cast to a float"):
        ew.binary(lib.IT_DIV, ta, ta)


SCALAR = {lib.IT_SCALAR_ADD: lambda x, s: x + s, lib.IT_SCALAR_MUL: lambda x, s: x * s,
          lib.IT_SCALAR_RSUB: lambda x, s: s - x, lib.IT_SCALAR_RDIV: lambda x, s: s / x,
          lib.IT_SCALAR_POW: lambda x, s: x ** s, lib.IT_SCALAR_MAX: np.maximum,
          lib.IT_SCALAR_MIN: np.minimum, lib.IT_SCALAR_DIV: lambda x, s: x / s}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(SCALAR))
@pytest.mark.parametrize("s", [2.0, 0.5, -1.5])
def test_scalar(op, s, dtype, rng):
    a = np.abs(rng.standard_normal(2051).astype(np.float32)) + 0.25
    t, a = make(a, dtype)
    out = ew.scalar(op, t, s)
    np.testing.assert_allclose(to_np(out), SCALAR[op](a.astype(np.float64), s),
                               **tol(dtype, (2e-6, 1e-6)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_forward_backward(dtype, rng):
    a = rng.standard_normal(3001).astype(np.float32)
    b = rng.standard_normal(3001).astype(np.float32)
    ta, a = make(a, dtype)
    tb, b = make(b, dtype)
    np.testing.assert_allclose(to_np(ew.swiglu(ta, tb)), a * sigmoid(a) * b, **tol(dtype))
    g = rng.standard_normal(3001).astype(np.float32)
    tg, g = make(g, dtype)
    da, db = ew.swiglu_backward(tg, ta, tb)
    s = sigmoid(a.astype(np.float64))
    np.testing.assert_allclose(to_np(db), g * a * s, **tol(dtype, (1e-5, 1e-6)))
    np.testing.assert_allclose(to_np(da), g * b * s * (1 + a * (1 - s)), **tol(dtype, (1e-5, 1e-6)))


def test_swiglu_gradient_numerical(rng):
    a, b, g = (rng.standard_normal(23) for _ in range(3))
    f = lambda a_, b_: np.sum(a_ * sigmoid(a_) * b_ * g)  # noqa: E731
    da, db = ew.swiglu_backward(*(it.tensor(x.astype(np.float32)) for x in (g, a, b)))
    np.testing.assert_allclose(da.numpy(), numerical_grad(lambda x: f(x, b), a), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(db.numpy(), numerical_grad(lambda x: f(a, x), b), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("width", [768, 3000])
def test_column_sums_are_each_column_added_in_order(width, rng):
    """A bias gradient: one output row, its columns split among the threads; each column is
    still the rows added one after another in float32, to the bit."""
    a = rng.standard_normal((300, width)).astype(np.float32)
    acc = np.zeros(width, np.float32)
    for row in a:
        acc += row
    np.testing.assert_array_equal(it.tensor(a).sum(0).numpy(), acc)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((10007,), None), ((3, 5, 7), 1), ((3, 5, 7), 2),
                                       ((3, 5, 7), 0), ((2, 4099), -1), ((4, 3, 2), (0, 2))])
def test_reductions(shape, dim, dtype, rng):
    a = rng.standard_normal(shape).astype(np.float32)
    t, a = make(a, dtype)
    axis = dim if dim is None or isinstance(dim, int) else tuple(dim)
    for name, ref in [("sum", np.sum), ("mean", np.mean)]:
        got = getattr(t, name)(dim)
        np.testing.assert_allclose(to_np(got), ref(a.astype(np.float64), axis=axis),
                                   **tol(dtype, (1e-5, 2e-5)))
        kept = getattr(t, name)(dim, keepdim=True)
        assert kept.shape == ref(a, axis=axis, keepdims=True).shape
    if isinstance(dim, int):
        values, indices = t.max(dim)
        np.testing.assert_array_equal(to_np(values), a.max(axis=dim))
        np.testing.assert_array_equal(indices.numpy(), a.argmax(axis=dim))
        values, indices = t.min(dim)
        np.testing.assert_array_equal(to_np(values), a.min(axis=dim))
        np.testing.assert_array_equal(indices.numpy(), a.argmin(axis=dim))
    else:
        np.testing.assert_array_equal(to_np(t.max(dim)), a.max(axis=axis))
        np.testing.assert_array_equal(to_np(t.min(dim)), a.min(axis=axis))
    if dim is None:
        assert t.argmax().item() == a.argmax()


def test_argmax_first_of_ties_and_nan():
    t = it.tensor([[1.0, 3.0, 3.0, 2.0], [0.0, np.nan, 5.0, np.nan]])
    assert t.argmax(1).numpy().tolist() == [1, 1]


MATMUL_CASES = [
    # (a shape, b shape, transpose a's last two dims?, transpose b's?)
    ((1, 1), (1, 1), False, False), ((7, 13), (13, 5), False, False),
    ((7, 13), (5, 13), False, True), ((13, 7), (13, 5), True, False),
    ((13, 7), (5, 13), True, True), ((3, 7, 13), (13, 5), False, False),
    ((3, 7, 13), (3, 13, 5), False, False), ((2, 1, 7, 13), (3, 5, 13), False, True),
    ((13,), (13, 5), False, False), ((4, 7, 13), (13,), False, False),
    ((3, 13, 7), (1, 13, 5), True, False),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", MATMUL_CASES)
def test_matmul(case, dtype, rng):
    sa, sb, ta_, tb_ = case
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    ta, a = make(a, dtype)
    tb, b = make(b, dtype)
    if ta_:
        ta, a = ta.transpose(-1, -2), np.swapaxes(a, -1, -2)
    if tb_:
        tb, b = tb.transpose(-1, -2), np.swapaxes(b, -1, -2)
    out = ta @ tb
    expected = a.astype(np.float64) @ b.astype(np.float64)
    assert out.shape == expected.shape
    np.testing.assert_allclose(to_np(out), expected, **tol(dtype, (1e-5, 1e-5)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(4, 5, 9), (300, 7, 9), (7, 300, 9), (513, 600, 9),
                                   (600, 20, 5000), (3, 700, 3000)])
def test_matmul_accumulate_native(m, n, k, dtype, rng):
    """alpha/beta and batch strides of the raw kernel, C = 2 A B^T + 0.5 C, with sizes that
    make the 16-bit path convert in several tiles along M or N and several chunks along K."""
    a, ar = make(rng.standard_normal((2, m, k)).astype(np.float32), dtype)
    b, br = make(rng.standard_normal((n, k)).astype(np.float32), dtype)
    c, cr = make(rng.standard_normal((2, m, n)).astype(np.float32), dtype)
    from infinitrain._native import check
    check(lib.it_matmul(a.device.native, dtype.native, c._ptr(), a._ptr(), b._ptr(), 2, m, n, k,
                        0, 1, 2.0, 0.5, m * k, 0, m * n))
    ref = 2 * ar.astype(np.float64) @ br.T.astype(np.float64) + 0.5 * cr
    np.testing.assert_allclose(to_np(c), ref, **tol(dtype, (1e-5, 1e-5 * max(1.0, k / 100))))


BF16_PATHS = {"amx": "AMX tiles", "avx512_bf16": "AVX512-BF16", "avx2": "AVX2 FMA on widened operands"}


def _bf16_products(tmp_path, path):
    """Four bfloat16 products (every transpose, odd K, edges, K = 5000) in a fresh process
    whose bf16 matmul path is capped at `path`: the products, and the path it reports."""
    import os
    code = ("import numpy as np, infinitrain as it\n"
            "rng = np.random.default_rng(5)\n"
            "out = {}\n"
            "for i, (m, n, k, ta, tb) in enumerate([(37, 300, 77, 0, 0), (300, 33, 513, 1, 0),\n"
            "                                       (64, 96, 5000, 0, 1), (5, 7, 3, 1, 1)]):\n"
            "    a = it.from_numpy(rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)).bfloat16()\n"
            "    b = it.from_numpy(rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)).bfloat16()\n"
            "    out[str(i)] = ((a.t() if ta else a) @ (b.t() if tb else b)).float().numpy()\n"
            "np.savez(__import__('sys').argv[1], **out)\n"
            "print(it.build_info())\n")
    file = tmp_path / f"{path}.npz"
    out = mpirun(1, ["-c", code, file], timeout=120, env={**os.environ, "INFINITRAIN_BF16_MATMUL": path})
    return np.load(file), out


@pytest.mark.slow
@pytest.mark.parametrize("path", BF16_PATHS)
def test_bfloat16_products_on_bf16_instructions_equal_the_sgemm_path(tmp_path, path):
    """Where bfloat16 products run on the CPU's bf16 instructions (AMX tiles, AVX512-BF16's
    VDPBF16PS) or on our AVX2 kernel (bf16 widened while packed), the fallback (converted to
    float32 around sgemm) gives the same numbers: the same exact products summed in float32
    in another order, so at most one bfloat16 step apart, and almost always equal. The shapes
    cover every transpose, odd K, edge tiles, and K in several chunks (5000)."""
    fast, info = _bf16_products(tmp_path, path)
    if f"bfloat16 products: {BF16_PATHS[path]}" not in info:
        pytest.skip(f"this CPU (or kernel) has no {BF16_PATHS[path]}")
    sgemm, info = _bf16_products(tmp_path, "sgemm")
    assert "bfloat16 products: float32 sgemm" in info
    for key in fast.files:
        # near-zero sums of large terms differ by float32 round-off, relative to the largest
        np.testing.assert_allclose(fast[key], sgemm[key], rtol=2 ** -7, atol=1e-6 * np.abs(sgemm[key]).max())
        assert np.mean(fast[key] == sgemm[key]) > 0.97, key


def test_matmul_shape_errors():
    with pytest.raises(ValueError, match=r"\(3, 4\) and \(5, 2\)"):
        it.zeros(3, 4) @ it.zeros(5, 2)
    with pytest.raises(TypeError, match="float32 but right is bfloat16"):
        it.zeros(3, 4) @ it.zeros(4, 2, dtype=it.bfloat16)
