"""The everyday torch.* surface (issue 44), held against PyTorch: the top-level forms of the Tensor
methods, the new pointwise functions, factories, norms, named-tuple returns, view()'s stride rule,
__format__, finfo/iinfo, and the switches programs flip (backends, compile, inference_mode)."""
import math
import warnings

import numpy as np
import pytest

import infinitrain as it

torch = pytest.importorskip("torch")

TOL = {"rtol": 1e-5, "atol": 1e-5}

# every public Tensor method that PyTorch also offers as torch.<name> has its infinitrain.<name>,
# and these everyday torch names exist
EVERYDAY = """abs add all allclose amax amin any arange argmax argmin argsort as_tensor bmm cat ceil chunk clamp clip
clone compile cos cumsum detach div einsum empty empty_like eq equal erf exp expm1 eye finfo flatten flip floor
floor_divide from_numpy full full_like gather ge get_default_dtype get_float32_matmul_precision gt iinfo
index_select inference_mode is_floating_point is_tensor isclose isfinite isinf isnan kthvalue le linspace log log10
log1p log2 log_softmax logical_not logspace logsumexp lt manual_seed masked_fill matmul max maximum mean median min
minimum mm mul multinomial narrow ne neg no_grad nonzero norm numel ones ones_like outer permute pow rand rand_like
randint randint_like randn randn_like randperm reciprocal relu repeat_interleave reshape roll round rsqrt select
set_default_dtype set_float32_matmul_precision sigmoid sign sin softmax sort split sqrt square squeeze stack std
sub sum t tanh tensor topk transpose tril triu trunc unbind unsqueeze use_deterministic_algorithms var where zeros
zeros_like Size Tensor Generator backends linalg cuda accelerator""".split()


def test_every_method_with_a_torch_function_has_one_here():
    methods = [n for n in dir(it.Tensor) if not n.startswith("_")]
    missing = [n for n in methods if callable(getattr(torch, n, None)) and not hasattr(it, n)]
    assert missing == []
    assert [n for n in EVERYDAY if not hasattr(it, n)] == []


def _pair(a, requires_grad=True):
    a = np.asarray(a, dtype=np.float32)
    return it.tensor(a, requires_grad=requires_grad), torch.tensor(a, requires_grad=requires_grad)


def _check(fn_it, fn_torch, *arrays, tol=TOL):
    """Values of fn and the gradients of sum(fn * w) for every input, against PyTorch."""
    ours, theirs = zip(*(_pair(a) for a in arrays))
    out_it, out_t = fn_it(*ours), fn_torch(*theirs)
    np.testing.assert_allclose(out_it.detach().numpy(), out_t.detach().numpy(), **tol)
    w = np.random.default_rng(1).standard_normal(tuple(out_t.shape)).astype(np.float32)
    (out_it * it.tensor(w)).sum().backward()
    (out_t * torch.tensor(w)).sum().backward()
    for a, b in zip(ours, theirs):
        zeros = np.zeros(tuple(b.shape), np.float32)
        got = a.grad.numpy() if a.grad is not None else zeros
        np.testing.assert_allclose(got, b.grad.numpy() if b.grad is not None else zeros, **tol)


UNARY = ["sin", "cos", "rsqrt", "neg", "square", "reciprocal", "relu", "exp", "log", "sqrt", "abs", "tanh",
         "sigmoid", "log1p", "expm1", "log2", "log10", "erf", "round", "floor", "ceil", "trunc", "frac"]


@pytest.mark.parametrize("name", UNARY)
def test_unary_functions_and_gradients_match_pytorch(name, rng):
    x = rng.standard_normal((4, 33)).astype(np.float32) * 3
    x[0, :6] = [1e-6, -1e-6, 2.5, -2.5, 0.5, -0.5]  # tiny arguments, ties of round
    if name in ("rsqrt", "log", "sqrt", "log2", "log10"):
        x = np.abs(x) + 0.1
    if name == "log1p":
        x = np.maximum(x, -0.9)
    if name == "reciprocal":
        x = np.where(np.abs(x) < 0.1, 0.5, x).astype(np.float32)
    _check(getattr(it, name), getattr(torch, name), x)
    _check(lambda t: getattr(t, name)(), lambda t: getattr(t, name)(), x)


def test_log1p_expm1_erf_keep_float32_accuracy_at_small_and_large_arguments():
    x = np.array([1e-8, -3e-7, 1e-4, 0.3, 0.49, 0.51, 2, 4.5, -6, 20, math.inf, -math.inf], np.float32)
    for name in ("log1p", "expm1", "erf"):
        xs = x[:-2] if name == "log1p" else x
        if name == "log1p":
            xs = np.append(xs, math.inf).astype(np.float32)
        ours = getattr(it, name)(it.tensor(xs)).numpy()
        np.testing.assert_allclose(ours, getattr(torch, name)(torch.tensor(xs)).numpy(), rtol=2e-6, atol=0)
        half = getattr(it, name)(it.tensor(xs).bfloat16()).float().numpy()  # worked in float32, rounded once
        np.testing.assert_allclose(half, getattr(torch, name)(torch.tensor(xs).bfloat16()).float().numpy(),
                                   rtol=2 ** -8, atol=1e-6)
    assert it.round(it.tensor([0.5, 1.5, 2.5, -0.5, 1e9, 3.7]), decimals=0).tolist() == [0, 2, 2, -0.0, 1e9, 4]
    np.testing.assert_allclose(it.tensor([1.2345, -2.5678]).round(decimals=2).numpy(),
                               torch.tensor([1.2345, -2.5678]).round(decimals=2).numpy(), **TOL)


def test_binary_and_shape_functions_match_pytorch(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    _check(lambda x: it.pow(x, 2), lambda x: torch.pow(x, 2), a)
    _check(lambda x, y: it.pow(x.abs() + 0.5, y), lambda x, y: torch.pow(x.abs() + 0.5, y), a, b)
    _check(lambda x: it.pow(2.0, x), lambda x: torch.pow(2.0, x), a)
    _check(lambda x: it.roll(x, 1, 1), lambda x: torch.roll(x, 1, 1), a)
    _check(lambda x: it.flip(x, (0, 1)), lambda x: torch.flip(x, (0, 1)), a)
    _check(lambda x: it.narrow(x, 1, 1, 2), lambda x: torch.narrow(x, 1, 1, 2), a)
    _check(lambda x: it.t(x), lambda x: torch.t(x), a)
    _check(lambda x: it.var(x, 1), lambda x: torch.var(x, 1), a)
    _check(lambda x: it.std(x, 0, keepdim=True), lambda x: torch.std(x, 0, keepdim=True), a)
    _check(lambda x, y: it.outer(x[0], y[1]), lambda x, y: torch.outer(x[0], y[1]), a, b)
    _check(lambda x: it.select(x, 1, 2), lambda x: torch.select(x, 1, 2), a)
    _check(lambda x: it.clip(x, -0.5, 0.5), lambda x: torch.clip(x, -0.5, 0.5), a)
    x = it.tensor([[1, -2], [0, 3]])
    assert (it.arange(3) ** 2).dtype is it.int64 and (2 ** it.arange(3)).tolist() == [1, 2, 4]
    for name in ("eq", "ne", "lt", "le", "gt", "ge"):
        assert getattr(it, name)(x, 0).tolist() == getattr(torch, name)(torch.tensor(x.tolist()), 0).tolist()
    assert it.numel(x) == 4 and it.is_tensor(x) and not it.is_tensor([1]) and not it.is_floating_point(x)
    assert it.nonzero(x).tolist() == [[0, 0], [0, 1], [1, 1]] and it.sign(x).tolist() == [[1, -1], [0, 1]]
    assert it.all(x != 5).item() and it.any(x, 1).tolist() == [True, True] and not it.all(x, 0)[0].item()
    assert [t.tolist() for t in it.unbind(x, 1)] == [[1, 0], [-2, 3]]
    assert it.floor_divide(x, 2).tolist() == [[0, -1], [0, 1]] and it.logical_not(x).tolist() == [[0, 0], [1, 0]]
    c = it.tensor([1.0, 2.0, math.nan])
    assert it.isclose(c, c + 1e-7).tolist() == [True, True, False] and it.isclose(c, c, equal_nan=True).all()
    assert it.equal(x, x.clone()) and not it.equal(x, x[:1])


def test_isnan_isinf_isfinite():
    v = [1.0, math.nan, math.inf, -math.inf, 0.0]
    for name in ("isnan", "isinf", "isfinite"):
        assert getattr(it, name)(it.tensor(v)).tolist() == getattr(torch, name)(torch.tensor(v)).tolist()
        assert getattr(it.tensor([1, 2]), name)().tolist() == getattr(torch.tensor([1, 2]), name)().tolist()


def test_repeat_interleave_function_and_method_with_gradients(rng):
    a = rng.standard_normal((3, 2)).astype(np.float32)
    _check(lambda x: it.repeat_interleave(x, 2), lambda x: torch.repeat_interleave(x, 2), a)
    _check(lambda x: x.repeat_interleave(3, dim=1), lambda x: x.repeat_interleave(3, dim=1), a)
    _check(lambda x: x.repeat_interleave(it.tensor([1, 0, 2]), 0),
           lambda x: x.repeat_interleave(torch.tensor([1, 0, 2]), 0), a)
    assert it.repeat_interleave(it.tensor([2, 1])).tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match="repeats"):
        it.ones(3).repeat_interleave(it.tensor([1, 2]))


@pytest.mark.parametrize("p,dim,keepdim", [("fro", None, False), (2, 1, False), (1, 0, True), (3, (0, 1), False),
                                           (math.inf, 1, False), (-math.inf, None, False), (0, 1, False),
                                           (0.5, -1, True)])
def test_norm_values_and_gradients(p, dim, keepdim, rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    a[1, 2] = a[1, 4] = 3.0  # a tie of the inf-norm
    _check(lambda x: it.norm(x, p, dim, keepdim), lambda x: torch.norm(x, p, dim, keepdim), a)
    _check(lambda x: x.norm(p, dim, keepdim), lambda x: x.norm(p, dim, keepdim), a)


def test_norm_gradient_at_zero_is_zero_and_linalg_norms():
    _check(lambda x: x.norm(), lambda x: x.norm(), np.zeros((2, 3)))
    a = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)
    _check(lambda x: it.linalg.norm(x), lambda x: torch.linalg.norm(x), a)
    _check(lambda x: it.linalg.norm(x, dim=-1), lambda x: torch.linalg.norm(x, dim=-1), a)
    _check(lambda x: it.linalg.vector_norm(x, 3, (0, 2), True),
           lambda x: torch.linalg.vector_norm(x, 3, (0, 2), True), a)
    for ord in ("fro", 1, -1, math.inf, -math.inf):
        _check(lambda x: it.linalg.matrix_norm(x, ord), lambda x: torch.linalg.matrix_norm(x, ord), a)
        _check(lambda x: it.linalg.norm(x[0], ord), lambda x: torch.linalg.norm(x[0], ord), a)
    with pytest.raises(NotImplementedError, match="nuc"):
        it.linalg.matrix_norm(it.tensor(a), "nuc")


def test_named_tuple_returns(rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    x, tx = it.tensor(a), torch.tensor(a)
    for name, args in (("max", (1,)), ("min", (0, True)), ("sort", (1,)), ("topk", (2,)), ("kthvalue", (2, 1)),
                       ("median", (1,))):
        ours, theirs = getattr(it, name)(x, *args), getattr(torch, name)(tx, *args)
        assert type(ours).__name__ == type(theirs).__name__ and ours._fields == ("values", "indices")
        np.testing.assert_allclose(ours.values.numpy(), theirs.values.numpy(), **TOL)
        assert ours.indices.tolist() == theirs.indices.tolist()
        values, indices = getattr(x, name)(*args)
        assert indices.tolist() == theirs.indices.tolist()
    assert float(it.median(x)) == float(torch.median(tx)) and float(x.max()) == float(tx.max())
    assert it.max(x, x + 1).tolist() == (x + 1).tolist() and x.min(x - 1).tolist() == (x - 1).tolist()
    _check(lambda t: t.kthvalue(3, 1).values, lambda t: t.kthvalue(3, 1).values, a)
    _check(lambda t: t.max(dim=0).values, lambda t: t.max(dim=0).values, a)


def test_view_of_a_split_piece_follows_pytorchs_stride_rule(rng):
    a = rng.standard_normal((2, 5, 12)).astype(np.float32)
    x, tx = _pair(a)
    q, k, v = x.split(4, dim=-1)
    tq, tk, tv = tx.split(4, dim=-1)
    y, ty = k.view(2, 5, 2, 2), tk.view(2, 5, 2, 2)
    assert y.stride() == ty.stride() and y.data_ptr() == x.data_ptr() + 4 * 4
    np.testing.assert_array_equal(y.detach().numpy(), ty.detach().numpy())
    ((y * y).sum() + q.view(10, 4).sum()).backward()
    ((ty * ty).sum() + tq.view(10, 4).sum()).backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), **TOL)
    z, tz = x.detach().transpose(0, 1), tx.detach().transpose(0, 1)  # (5, 2, 12) strides (12, 60, 1)
    for shape in ((5, 2, 3, 4), (5, 2, 12, 1), (1, 5, 2, 12)):
        assert z.view(shape).stride() == tz.view(shape).stride()
    for bad in ((10, 12), (5, 24)):
        with pytest.raises(RuntimeError, match="view size is not compatible with input tensor's size and stride"):
            z.view(bad)
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            tz.view(bad)
    assert z.reshape(10, 12).stride() == (12, 1)  # a copy where no view exists
    assert x.detach()[:, 1:3].view_as(it.zeros(2, 24)).stride() == tx.detach()[:, 1:3].view(2, 24).stride()
    assert x.type_as(it.zeros(1, dtype=it.float64)).dtype is it.float64


def test_format_of_tensors():
    loss = it.tensor(1.234567)
    assert f"{loss:.4f}" == "1.2346" == f"{torch.tensor(1.234567):.4f}" and f"{it.tensor(7):>3}" == "  7"
    assert f"{it.ones(2)}" == str(it.ones(2))
    with pytest.raises(TypeError):
        f"{it.ones(2):.3f}"


def test_factories_match_pytorch():
    for args in ((0.0, 1.0, 5), (-3.3, 7.1, 17), (2, 2, 1), (0, 1, 0)):
        np.testing.assert_allclose(it.linspace(*args).numpy(), torch.linspace(*args).numpy(), **TOL)
    np.testing.assert_allclose(it.logspace(0, 3, 4).numpy(), torch.logspace(0, 3, 4).numpy(), **TOL)
    np.testing.assert_allclose(it.logspace(0, 3, 4, base=2).numpy(), torch.logspace(0, 3, 4, base=2).numpy())
    assert it.eye(3).tolist() == torch.eye(3).tolist() and it.eye(2, 3, dtype=it.int64).dtype is it.int64
    it.manual_seed(5)
    r = it.randint(3, 9, (1000,))
    assert r.dtype is it.int64 and r.min().item() == 3 and r.max().item() == 8
    assert it.randint(10, (2, 3)).shape == (2, 3) == it.randint(4, size=(2, 3)).shape
    assert it.randint(2 ** 40, (8,)).max().item() > 2 ** 30
    assert sorted(it.randperm(50).tolist()) == list(range(50)) and it.randperm(0).shape == (0,)
    base = it.zeros(2, 3, dtype=it.float64)
    for like in (it.rand_like(base), it.randn_like(base), it.randint_like(base, 5), it.zeros_like(base)):
        assert like.shape == (2, 3) and like.dtype is it.float64
    assert it.randn_like(base, requires_grad=True).requires_grad and it.randint_like(base, 2, 4).min() >= 2
    it.manual_seed(1)
    first = it.randperm(10).tolist()
    it.manual_seed(1)
    assert it.randperm(10).tolist() == first


def test_size_finfo_iinfo_and_default_dtype():
    s = it.zeros(2, 3, 4).shape
    assert isinstance(s, it.Size) and isinstance(s, tuple) and s.numel() == 24 and s == (2, 3, 4)
    assert isinstance(s[1:], it.Size) and s[1:] == (3, 4) and repr(s) == "infinitrain.Size([2, 3, 4])"
    for d, td in ((it.float32, torch.float32), (it.bfloat16, torch.bfloat16), (it.float16, torch.float16),
                  (it.float64, torch.float64)):
        ours, theirs = it.finfo(d), torch.finfo(td)
        for attr in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution", "dtype"):
            assert getattr(ours, attr) == getattr(theirs, attr), (d, attr)
    for d, td in ((it.int32, torch.int32), (it.int64, torch.int64), (it.uint8, torch.uint8)):
        assert (it.iinfo(d).max, it.iinfo(d).min, it.iinfo(d).bits) == (torch.iinfo(td).max, torch.iinfo(td).min,
                                                                        torch.iinfo(td).bits)
    with pytest.raises(TypeError):
        it.iinfo(it.float32)
    assert it.finfo().dtype == "float32" and it.get_default_dtype() is it.float32
    it.set_default_dtype(it.float32)
    with pytest.raises(NotImplementedError, match="float32"):
        it.set_default_dtype(it.float64)
    with pytest.raises(TypeError, match="floating-point"):
        it.set_default_dtype(it.int64)


def test_backends_precision_and_settings():
    assert it.get_float32_matmul_precision() == "highest" and not it.backends.cuda.matmul.allow_tf32
    it.set_float32_matmul_precision("high")
    assert it.backends.cuda.matmul.allow_tf32 and it.get_float32_matmul_precision() == "high"
    it.backends.cuda.matmul.allow_tf32 = False
    assert it.get_float32_matmul_precision() == "highest"
    with pytest.warns(UserWarning, match="had no effect"):
        it.set_float32_matmul_precision("low")
    assert it.get_float32_matmul_precision() == "highest"
    it.backends.cudnn.benchmark = True
    it.backends.cudnn.allow_tf32 = True
    assert it.backends.cudnn.enabled and not it.backends.cudnn.deterministic and not it.backends.mps.is_available()
    assert it.backends.cpu.get_cpu_capability() in ("AVX2", "DEFAULT")
    it.use_deterministic_algorithms(True)
    assert it.are_deterministic_algorithms_enabled()
    it.use_deterministic_algorithms(False)
    assert it.manual_seed(3) is it.default_generator and it.initial_seed() == 3
    it.cuda.manual_seed(4)
    it.cuda.manual_seed_all(4)
    assert it.initial_seed() == 4
    assert it.accelerator.is_available() == it.cuda.is_available()
    assert it.accelerator.device_count() == it.cuda.device_count()
    assert (it.accelerator.current_accelerator() is None) == (not it.cuda.is_available())


def test_compile_returns_the_model_and_inference_mode_is_no_grad():
    model = it.nn.Linear(3, 2)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert it.compile(model) is model
        assert it.compile(model, mode="max-autotune", fullgraph=True, dynamic=False) is model

        @it.compile
        def f(x):
            return x * 2

        @it.compile(backend="eager")
        def g(x):
            return x + 1
    assert f(3) == 6 and g(3) == 4
    x = it.ones(2, requires_grad=True)
    with it.inference_mode():
        assert not it.is_grad_enabled() and it.is_inference_mode_enabled()
        assert not (x * 2).requires_grad
    assert it.is_grad_enabled() and not it.is_inference_mode_enabled()
    with it.inference_mode(False):
        assert (x * 2).requires_grad

    @it.inference_mode()
    def h(t):
        return t * 2

    @it.inference_mode
    def k(t):
        return t * 3
    assert not h(x).requires_grad and not k(x).requires_grad and (x * 2).requires_grad


def test_more_everyday_functions_match_pytorch(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    a[0, 1] = 0.0  # a zero in a product
    _check(it.tan, torch.tan, a * 0.5)
    _check(lambda x, y: it.lerp(x, y, 0.3), lambda x, y: torch.lerp(x, y, 0.3), a, b)
    _check(lambda x, y: it.dot(x[1], y[2]), lambda x, y: torch.dot(x[1], y[2]), a, b)
    _check(lambda x, y: it.addmm(x[0, :3], x, y.t(), beta=0.5, alpha=2),
           lambda x, y: torch.addmm(x[0, :3], x, y.t(), beta=0.5, alpha=2), a, b)
    for k in (0, 1, -2):
        _check(lambda x: it.diag(x, k), lambda x: torch.diag(x, k), a)
        _check(lambda x: it.diag(x[1], k), lambda x: torch.diag(x[1], k), a)
    for dim, keepdim in ((None, False), (1, False), (0, True), (-1, True)):
        _check(lambda x: it.prod(x) if dim is None else it.prod(x, dim, keepdim),
               lambda x: torch.prod(x) if dim is None else torch.prod(x, dim, keepdim), a)
    assert it.prod(it.tensor([[2, 3, 5]]), 1).tolist() == [30] and it.ones(0).prod().item() == 1
    _check(lambda x: it.masked_select(x, x > 0), lambda x: torch.masked_select(x, x > 0), a)
    _check(lambda x: it.masked_select(x, it.tensor([True, False, True, True])),
           lambda x: torch.masked_select(x, torch.tensor([True, False, True, True])), a)
    _check(lambda x, y: it.meshgrid(x[0], y[1, :3], indexing="xy")[1] * it.meshgrid(x[0], y[1, :3])[0].t(),
           lambda x, y: torch.meshgrid(x[0], y[1, :3], indexing="xy")[1] * torch.meshgrid(x[0], y[1, :3],
                                                                                          indexing="ij")[0].t(),
           a, b)
    p, q = it.tensor([True, False, True]), it.tensor([1, 1, 0])
    tp, tq = torch.tensor([True, False, True]), torch.tensor([1, 1, 0])
    for name in ("logical_and", "logical_or", "logical_xor"):
        assert getattr(it, name)(p, q).tolist() == getattr(torch, name)(tp, tq).tolist()
    assert it.count_nonzero(it.tensor(a), 1).tolist() == torch.count_nonzero(torch.tensor(a), 1).tolist()
    it.manual_seed(0)
    draws = it.bernoulli(it.full((4000,), 0.25))
    assert set(draws.tolist()) <= {0.0, 1.0} and abs(draws.mean().item() - 0.25) < 0.03
    mean, std = _pair(a)[0], _pair(np.abs(b) + 0.5)[0]
    sample = it.normal(mean, std)
    sample.sum().backward()
    assert sample.shape == (3, 4) and np.allclose(mean.grad.numpy(), 1)
    assert it.normal(2.0, 3.0, (2, 5)).shape == (2, 5)


def test_remainder_fmod_aliases_and_axis_moves(rng):
    a = (rng.standard_normal((3, 4)) * 4).astype(np.float32)
    b = np.where(rng.random((3, 4)) < 0.5, -1.5, 2.5).astype(np.float32)
    _check(lambda x: x % it.tensor(b), lambda x: x % torch.tensor(b), a)  # (PyTorch has no gradient for b)
    _check(lambda x, y: it.remainder(x, 1.5) + it.fmod(x, y), lambda x, y: torch.remainder(x, 1.5) + torch.fmod(x, y),
           a, b)
    np.testing.assert_allclose((7.0 % (it.tensor(a).abs() + 1)).numpy(), (7.0 % (torch.tensor(a).abs() + 1)).numpy(),
                               **TOL)
    assert (it.arange(-3, 4) % 3).tolist() == (torch.arange(-3, 4) % 3).tolist()
    assert it.fmod(it.arange(-3, 4), 2).tolist() == torch.fmod(torch.arange(-3, 4), 2).tolist()
    _check(lambda x: it.movedim(x.unflatten(1, (2, 2)), (0, 2), (2, 0)),
           lambda x: torch.movedim(x.unflatten(1, (2, 2)), (0, 2), (2, 0)), a)
    _check(lambda x: it.tile(x, (2, 1, 1)).swapaxes(0, 2).ravel(),
           lambda x: torch.tile(x, (2, 1, 1)).swapaxes(0, 2).ravel(), a)
    _check(lambda x: it.exp2(x) * it.multiply(x, 2) - it.subtract(x, 1), lambda x: torch.exp2(x) * torch.multiply(x, 2)
           - torch.subtract(x, 1), a * 0.1)
    assert it.greater(it.tensor(a), 0).tolist() == torch.greater(torch.tensor(a), 0).tolist()
