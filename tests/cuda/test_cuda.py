"""The CUDA half. Without a GPU (CI): the CUDA library is built wherever nvcc is, links
nothing a CPU machine lacks, exports a CUDA implementation of the kernels, and every CUDA call
ends in a clear error naming what is missing; streams and events work on the CPU. With a GPU:
every kernel against the CPU kernel (fp32 rtol 1e-5, bf16 1e-2), autograd through CUDA
tensors, and a tiny GPT-2 trained on CUDA against the same on the CPU."""
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import infinitrain as it
from infinitrain import nn
from infinitrain._native import HEADER_PATH as HEADER
from infinitrain._native import LIBRARY_PATH, ffi, lib
from helpers import ENV, MPI_SCRIPTS, example, launch, mpirun, run, step_losses

pytestmark = pytest.mark.cuda

GPU = it.cuda.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="no CUDA device on this machine")
LIBDIR = LIBRARY_PATH.parent
CUDA_LIB = LIBDIR / "libinfinitrain_cuda.so"
NOT_YET = set()  # every kernel of the header has a CUDA implementation


@pytest.mark.skipif(GPU, reason="a GPU is present")
def test_without_a_gpu_every_cuda_call_is_a_clear_error():
    assert not it.cuda.is_available() and it.cuda.device_count() == 0
    reason = "no CUDA device" if CUDA_LIB.is_file() else "no CUDA support"
    for call in (lambda: it.zeros(2, device="cuda"), lambda: it.ones(3).to("cuda:1"), it.cuda.Stream,
                 lambda: it.ones(2).pin_memory(),
                 lambda: it.tensor([1.0], device="cuda"), lambda: it.tensor(it.ones(2), device="cuda"),
                 it.cuda.synchronize, it.cuda.memory_stats):
        with pytest.raises(it.NoCudaError, match=reason):
            call()
    assert "CUDA: " in it.build_info()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc: the CUDA library is not built here")
def test_the_cuda_library_is_built_wherever_nvcc_is_and_needs_no_cuda_library():
    assert CUDA_LIB.is_file(), "INFINITRAIN_CUDA=AUTO with nvcc on PATH must build libinfinitrain_cuda.so"
    dyn = run(["readelf", "-d", CUDA_LIB]).stdout
    needed = set(re.findall(r"\(NEEDED\).*\[(.+?)\]", dyn))
    allowed = {"libstdc++.so.6", "libgcc_s.so.1", "libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2",
               "libdl.so.2", "libpthread.so.0", "librt.so.1"}
    assert needed <= allowed, f"links {needed - allowed}: cudart must be static, cuBLAS/NCCL opened at run time"
    runpath = re.search(r"\((?:RUNPATH|RPATH)\).*\[(.+?)\]", dyn).group(1)
    if runpath.strip(":"):  # an installed library (a CMake build tree only reserves the space)
        assert "$ORIGIN/../../nvidia/cu13/lib" in runpath and "$ORIGIN/../../nvidia/nccl/lib" in runpath
    # the CPU library never links CUDA either
    cpu = run(["readelf", "-d", LIBDIR / "libinfinitrain.so"]).stdout
    assert not re.search(r"NEEDED.*(cuda|cublas|nccl)", cpu)


@pytest.mark.slow
@pytest.mark.skipif(not CUDA_LIB.is_file(), reason="this build has no CUDA library")
def test_every_kernel_has_a_cuda_implementation():
    kernels = set(re.findall(r"it_status it_(\w+)\(it_device device", HEADER.read_text()))
    kernels -= {"storage_new", "storage_wrap"}  # memory: the allocator's it_cuda_malloc
    syms = run(["nm", "-D", "--defined-only", CUDA_LIB]).stdout
    have = set(re.findall(r" T it_cuda_(\w+)", syms))
    assert kernels - have == NOT_YET, f"without a CUDA kernel: {sorted(kernels - have)}"
    cuda0 = ffi.new("it_device *", [lib.IT_CUDA, 0])[0]
    p = ffi.cast("void *", 64)  # never dereferenced: the call stops before any kernel runs
    if not GPU:  # implemented: checked, handed to the CUDA library, which finds no device
        st = lib.it_unary(cuda0, lib.IT_EXP, lib.IT_FLOAT32, p, p, 4)
        assert st == lib.IT_ERR_NO_CUDA and \
            ffi.string(lib.it_last_error()).decode().startswith("it_unary: no CUDA device")


def test_arguments_are_checked_before_the_cuda_library_is_asked():
    """The library checks every argument once, before it hands a CUDA call over: a NULL pointer,
    a negative or overflowing shape, too many dimensions or an op the dtype cannot take is
    refused here, GPU or none (the CUDA kernels trust what they get: on a GPU these would be
    illegal memory accesses, which end the whole CUDA context)."""
    cuda0 = ffi.new("it_device *", [lib.IT_CUDA, 0])[0]
    p, null = ffi.cast("void *", 64), ffi.NULL
    ones, neg, huge = (ffi.new("int64_t[17]", [1] * 17), ffi.new("int64_t[2]", [2, -3]),
                       ffi.new("int64_t[2]", [2**40] * 2))
    calls = {
        "it_binary": lambda shape, nd, a: lib.it_binary(cuda0, lib.IT_ADD, lib.IT_FLOAT32, p, a, ones, p, ones,
                                                       shape, nd),
        "it_compare": lambda shape, nd, a: lib.it_compare(cuda0, lib.IT_LT, lib.IT_FLOAT32, ffi.cast("uint8_t *", p), a,
                                                         ones, p, ones, shape, nd),
        "it_where": lambda shape, nd, a: lib.it_where(cuda0, lib.IT_FLOAT32, p, ffi.cast("uint8_t *", p), ones, a, ones,
                                                     p, ones, shape, nd),
        "it_copy_strided": lambda shape, nd, a: lib.it_copy_strided(cuda0, lib.IT_FLOAT32, p, ones, a, ones, shape, nd),
    }
    for name, call in calls.items():
        for shape, nd, a in ((ones, 17, p), (neg, 2, p), (huge, 2, p), (ones, 2, null)):
            assert call(shape, nd, a) == lib.IT_ERR_INVALID_ARGUMENT, (name, nd)
            assert ffi.string(lib.it_last_error()).decode().startswith(name + ":")
    assert lib.it_scalar(cuda0, lib.IT_SCALAR_ADD, lib.IT_BOOL, p, p, 1.0, 4) == lib.IT_ERR_NOT_SUPPORTED
    assert lib.it_scalar(cuda0, lib.IT_SCALAR_ADD, lib.IT_INT32, p, p, 2.5, 4) == lib.IT_ERR_NOT_SUPPORTED
    assert lib.it_scalar(cuda0, lib.IT_SCALAR_DIV, lib.IT_INT64, p, p, 2.0, 4) == lib.IT_ERR_NOT_SUPPORTED


@pytest.mark.slow
@pytest.mark.skipif(not CUDA_LIB.is_file() or GPU, reason="needs the CUDA library and no GPU")
def test_no_kernel_reads_device_memory_on_the_host():
    """Every kernel called on cuda:0 with device addresses the host cannot read gets through the
    library's checks to the CUDA library, which finds no device. Checks that read the data
    (embedding ids, gather indices) must leave CUDA memory to the kernels: on a GPU the host
    reading it is a segmentation fault (it was, for embeddings and gather/scatter, before any
    kernel ran)."""
    out = mpirun(1, [Path(__file__).parent / "cuda_dispatch_probe.py"], timeout=120, check=False)
    lines = out.stdout.splitlines()
    assert out.returncode == 0, f"died (exit {out.returncode}) in {lines[-1] if lines else '?'}\n{out.stderr}"
    assert len(lines) > 40
    for line in lines:
        name, status, where = line.split()
        assert int(status) == lib.IT_ERR_NO_CUDA and where == name, line


def test_streams_and_events_on_the_cpu_complete_at_once():
    cpu = ffi.new("it_device *", [lib.IT_CPU, 0])[0]
    s, e = ffi.new("it_stream **"), ffi.new("it_event **")
    assert lib.it_stream_create(cpu, s) == lib.IT_OK and lib.it_event_create(cpu, e) == lib.IT_OK
    done = ffi.new("int32_t *")
    assert lib.it_event_record(e[0], s[0]) == lib.IT_OK
    assert lib.it_stream_wait_event(s[0], e[0]) == lib.IT_OK
    assert lib.it_event_query(e[0], done) == lib.IT_OK and done[0] == 1
    assert lib.it_stream_synchronize(s[0]) == lib.IT_OK and lib.it_set_stream(cpu, s[0]) == lib.IT_OK
    assert lib.it_set_stream(cpu, ffi.NULL) == lib.IT_OK and lib.it_device_synchronize(cpu) == lib.IT_OK
    assert lib.it_event_destroy(e[0]) == lib.IT_OK and lib.it_stream_destroy(s[0]) == lib.IT_OK
    assert lib.it_event_record(ffi.NULL, ffi.NULL) == lib.IT_ERR_INVALID_ARGUMENT


# ---- on a GPU ------------------------------------------------------------------------------
RNG = np.random.default_rng(0)


def _pair(shape, dtype="float32", low=-2.0, high=2.0):
    a = RNG.uniform(low, high, shape).astype(np.float32)
    return it.from_numpy(a).to(dtype), it.from_numpy(a).to(dtype).to("cuda")


def _same(gpu, cpu, dtype="float32", rtol=None):
    """Equal within rtol, and within a few roundings of the largest value where a result is near
    zero (a normalised row computed in another order differs there by an ulp of its scale)."""
    rtol = rtol or (1e-5 if dtype == "float32" else 1e-2)
    g, c = gpu.detach().cpu().float().numpy(), cpu.detach().float().numpy()
    np.testing.assert_allclose(g, c, rtol=rtol, atol=rtol * max(1.0, float(np.abs(c).max())) * 0.1)


UNARY = ["exp", "log", "sqrt", "rsqrt", "abs", "tanh", "sigmoid", "relu", "sin", "cos", "neg", "square"]


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", UNARY)
def test_unary_ops_and_gradients_against_the_cpu(name, dtype):
    c, g = _pair((37, 65), dtype, 0.1, 3.0)
    fn = getattr(it, name, None) or (lambda x: getattr(x, name)())
    c.requires_grad_(), g.requires_grad_()
    yc, yg = fn(c), fn(g)
    _same(yg, yc, dtype)
    yc.float().sum().backward()
    yg.float().sum().backward()
    _same(g.grad, c.grad, dtype)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_elementwise_kernels_take_vectors_with_the_one_at_a_time_bits(dtype):
    """Contiguous elementwise kernels take 16 bytes a thread where the pointers allow; a view one
    element in (misaligned: one element at a time) gives the same bits, and so does the tail of
    a length that is no multiple of the vector."""
    full = it.from_numpy(RNG.standard_normal(1004).astype(np.float64)).to(dtype).to("cuda")
    aligned, shifted = full[:1003].contiguous(), full[1:]  # the same 1003 values; shifted starts 1 in
    shifted_values = full[1:].contiguous()
    assert np.array_equal(aligned.cpu().float().numpy()[1:], shifted_values.cpu().float().numpy()[:-1])

    def results(x):
        x = x.detach().requires_grad_()
        y = nn.functional.gelu(x)
        y.backward(it.ones_like(y))
        casts = [x.detach().to(d) for d in ("float32", "bfloat16") if d != dtype]
        d = x.detach()
        return [y, x.grad, d * 3.0, d.exp(), d + d.exp(), d * d, *casts]

    for a, b in zip(results(shifted_values), results(shifted)):
        np.testing.assert_array_equal(a.cpu().float().numpy(), b.cpu().float().numpy())


@needs_gpu
def test_casts_between_float_dtypes_have_the_cpus_bits():
    """float32 / bfloat16 / float16 among themselves (autocast's copies): rounding to nearest
    even on ties, NaN, infinities, float16's overflow and subnormals, as the CPU casts."""
    edge = [0.0, -0.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -9, 65504.0, 65520.0, 1e6, 2 ** -20, 6e-8, float("nan"),
            float("inf"), -float("inf"), -3.14159]
    x = it.from_numpy(np.concatenate([np.array(edge, np.float32), RNG.standard_normal(1000).astype(np.float32)]))
    for a in ("float32", "bfloat16", "float16"):
        for b in ("float32", "bfloat16", "float16"):
            src = x.to(a)
            got, want = src.to("cuda").to(b).cpu(), src.to(b)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got.float().numpy(), want.float().numpy(), err_msg=f"{a} -> {b}")


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kernels_against_the_cpu(dtype):
    (a, ag), (b, bg) = _pair((4, 1, 33), dtype), _pair((5, 33), dtype)
    for op in (lambda x, y: x + y, lambda x, y: x * y, lambda x, y: x - y, lambda x, y: x / (y.abs() + 1),
               it.maximum, lambda x, y: x > y, lambda x, y: it.where(x > y, x, y)):
        _same(op(ag, bg), op(a, b), dtype)
    x, xg = _pair((6, 40, 32), dtype)
    for red in (lambda t: t.sum(1), lambda t: t.mean(-1), lambda t: t.amax(0), lambda t: t.argmax(-1).float(),
                lambda t: it.cumsum(t.float(), 1)):
        _same(red(xg), red(x), dtype)
    w, wg = _pair((32,), dtype)
    bias, biasg = _pair((32,), dtype)
    _same(nn.functional.layer_norm(xg, (32,), wg, biasg), nn.functional.layer_norm(x, (32,), w, bias), dtype)
    _same(nn.functional.softmax(xg, -1), nn.functional.softmax(x, -1), dtype)
    m1, m1g = _pair((3, 17, 24), dtype)
    m2, m2g = _pair((3, 24, 9), dtype)
    _same(m1g @ m2g, m1 @ m2, dtype, rtol=1e-4 if dtype == "float32" else 2e-2)
    _same(xg.transpose(1, 2).contiguous(), x.transpose(1, 2).contiguous(), dtype)
    heads, heads_g = _pair((2, 5, 3, 3, 16), dtype)  # [B, T, 3, H, D] -> [B, H, T, D]: whole 16-byte rows
    for pick in (lambda t: t[:, :, 1].permute(0, 2, 1, 3), lambda t: t[:, 1:4, 2, :, 8:].transpose(0, 1),
                 lambda t: t[:, :, 0, :, 3:10].permute(0, 2, 1, 3)):  # the last: rows not of whole chunks
        assert np.array_equal(pick(heads_g).contiguous().cpu().float().numpy(),
                              pick(heads).contiguous().float().numpy())
    _same(it.cat([xg, xg * 2], 1), it.cat([x, x * 2], 1), dtype)
    vals, idx = it.topk(x, 5, dim=-1)
    vals_g, idx_g = it.topk(xg, 5, dim=-1)
    _same(vals_g, vals, dtype)
    assert idx_g.cpu().tolist() == idx.tolist()
    weights = x.float().abs().reshape(-1, 32)
    draws = it.multinomial(weights, 4, generator=it.Generator(7))
    assert it.multinomial(weights.to("cuda"), 4, generator=it.Generator(7)).cpu().tolist() == draws.tolist()
    ids = it.from_numpy(RNG.integers(0, 40, (3, 5)))
    table, tableg = _pair((40, 32), dtype)
    _same(nn.functional.embedding(ids.to("cuda"), tableg), nn.functional.embedding(ids, table), dtype)


@needs_gpu
def test_convolution_pooling_and_batch_norm_against_the_cpu():
    """Values and input/weight/bias gradients of the direct CUDA kernels (float32 only) against
    the CPU's im2col ones, over strides, padding, dilation and groups; the pools' overlapping
    windows; batch norm's running statistics."""
    F = nn.functional
    x, xg = _pair((2, 4, 9, 8), "float32")
    w, wg = _pair((6, 2, 3, 2), "float32")
    b, bg = _pair((6,), "float32")
    g, gg = _pair((2, 6, 5, 8), "float32")
    for t in (x, xg, w, wg, b, bg):
        t.requires_grad_()
    yc, yg = F.conv2d(x, w, b, stride=(2, 1), padding=1, dilation=(1, 2), groups=2), \
        F.conv2d(xg, wg, bg, stride=(2, 1), padding=1, dilation=(1, 2), groups=2)
    _same(yg, yc)
    (yc * g).sum().backward()
    (yg * gg).sum().backward()
    for ours, cpu in ((xg, x), (wg, w), (bg, b)):
        _same(ours.grad, cpu.grad)
    for pool in (lambda t: F.max_pool2d(t, 3, 2, 1, ceil_mode=True), lambda t: F.max_pool2d(t, 2, 1, dilation=2),
                 lambda t: F.avg_pool2d(t, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                 lambda t: F.adaptive_avg_pool2d(t, (4, 3))):
        x.grad = xg.grad = None
        pc, pg = pool(x), pool(xg)
        _same(pg, pc)
        (pc * pc).sum().backward()
        (pg * pg).sum().backward()
        _same(xg.grad, x.grad)
    bn, bng = nn.BatchNorm2d(4), nn.BatchNorm2d(4).to("cuda")
    x.grad = xg.grad = None
    yc, yg = bn(x), bng(xg)
    _same(yg, yc)
    (yc * yc * x).sum().backward()
    (yg * yg * xg).sum().backward()
    _same(xg.grad, x.grad)
    _same(bng.weight.grad, bn.weight.grad)
    _same(bng.running_var, bn.running_var)
    _same(bng.eval()(xg), bn.eval()(x))


@needs_gpu
@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "float64"])
def test_every_dtype_the_cpu_takes_works_on_cuda(dtype):
    """Integer, bool and float64 tensors: arithmetic with tensors and scalars, comparisons,
    where, & and | of masks (tensor parallelism's vocabulary masks), running and scattered sums,
    reductions; the same values as on the CPU."""
    from infinitrain.kernels import index as kidx
    x, y = (it.from_numpy(RNG.integers(0, 60, (6, 7)).astype(dtype)) for _ in range(2))
    xg, yg = x.to("cuda"), y.to("cuda")
    ops = [lambda a, b: a + b, lambda a, b: a * b, it.maximum, it.minimum, lambda a, b: a + 3,
           lambda a, b: a * 2, lambda a, b: it.maximum(a, b) - b, lambda a, b: a > b, lambda a, b: a == b,
           lambda a, b: it.where(a > b, a, b), lambda a, b: (a > 20) & (b < 40), lambda a, b: (a > 50) | (b < 5),
           lambda a, b: it.cumsum(a, 1), lambda a, b: a.sum(0), lambda a, b: a.amax(1), lambda a, b: a.argmax(0),
           lambda a, b: a.float()]
    if dtype != "uint8":
        ops.append(lambda a, b: 100 - a)
    for i, op in enumerate(ops):
        assert op(xg, yg).cpu().tolist() == op(x, y).tolist(), f"op {i} on {dtype}"
    index = it.from_numpy(RNG.integers(0, 4, (6, 7)))
    for fn in (kidx.scatter_add, kidx.index_add):
        idx = index if fn is kidx.scatter_add else it.from_numpy(np.array([3, 0, 3, 1, 2, 0]))
        out = fn(it.zeros(4, 7, dtype=x.dtype), 0, idx, x)
        outg = fn(it.zeros(4, 7, dtype=x.dtype, device="cuda"), 0, idx.to("cuda"), xg)
        assert outg.cpu().tolist() == out.tolist(), fn.__name__


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reductions_of_few_long_rows_and_columns_against_the_cpu(dtype):
    """Few outputs over many elements take the chunked two-pass kernels: whole-tensor sums (a
    gradient's norm), long rows, tall columns (a bias or LayerNorm weight gradient)."""
    rows, rowsg = _pair((3, 70001), dtype)
    for red in (lambda t: t.sum(), lambda t: t.sum(-1), lambda t: t.mean(-1), lambda t: t.amax(-1),
                lambda t: t.amin(), lambda t: (t * t).float().sum(), lambda t: t.sum(0), lambda t: t.mean(0)):
        _same(red(rowsg), red(rows), dtype, rtol=1e-4 if dtype == "float32" else 2e-2)
    tall, tallg = _pair((9000, 3, 5), dtype)
    for red in (lambda t: t.sum(0), lambda t: t.mean(0), lambda t: t.amax(0), lambda t: t.sum((0, 2))):
        _same(red(tallg), red(tall), dtype, rtol=1e-4 if dtype == "float32" else 2e-2)
    wide, wideg = _pair((2, 3000, 40), dtype)  # rows of whole vectors: columns a vector at a time
    for red in (lambda t: t.sum(1), lambda t: t.amin(1), lambda t: t[:, :, 1:33].sum(1)):  # the last: one at a time
        _same(red(wideg), red(wide), dtype, rtol=1e-4 if dtype == "float32" else 2e-2)
    x, xg = _pair((5000, 48), dtype)
    w, wg = _pair((48,), dtype)
    b, bg = _pair((48,), dtype)
    for t in (x, xg, w, wg, b, bg):
        t.requires_grad_()
    for norm in (lambda t, w, b: nn.functional.layer_norm(t, (48,), w, b),
                 lambda t, w, b: nn.functional.rms_norm(t, (48,), w) + b):
        for t in (x, xg, w, wg, b, bg):
            t.grad = None
        (norm(x, w, b).float() ** 2).sum().backward()
        (norm(xg, wg, bg).float() ** 2).sum().backward()
        for gg, gc in ((xg, x), (wg, w), (bg, b)):
            _same(gg.grad, gc.grad, dtype, rtol=1e-4 if dtype == "float32" else 3e-2)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows,C,affine", [(37, 48, True), (37, 45, True), (9, 64, False), (3, 5000, True)])
def test_layer_norm_rows_against_the_cpu(dtype, rows, C, affine):
    """LayerNorm's row kernels on each path: a warp a row with vector loads (48, 64 wide; no
    weight), a warp a row one value at a time (45), a block a row (5000: past a warp's rows)."""
    (x, xg), (w, wg), (b, bg) = _pair((rows, C), dtype), _pair((C,), dtype), _pair((C,), dtype)
    for t in (x, xg, w, wg, b, bg):
        t.requires_grad_()
    yc = nn.functional.layer_norm(x, (C,), w if affine else None, b if affine else None)
    yg = nn.functional.layer_norm(xg, (C,), wg if affine else None, bg if affine else None)
    _same(yg, yc, dtype, rtol=1e-4 if dtype == "float32" else 2e-2)
    (yc.float() ** 2).sum().backward()
    (yg.float() ** 2).sum().backward()
    for gg, gc in ((xg, x), (wg, w), (bg, b)) if affine else ((xg, x),):
        _same(gg.grad, gc.grad, dtype, rtol=1e-4 if dtype == "float32" else 3e-2)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_attention_loss_and_optimizer_against_the_cpu(dtype):
    q, qg = _pair((2, 4, 19, 16), dtype)
    k, kg = _pair((2, 2, 19, 16), dtype)
    v, vg = _pair((2, 2, 19, 16), dtype)
    for t in (q, k, v, qg, kg, vg):
        t.requires_grad_()
    yc = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    yg = nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=True, enable_gqa=True)
    _same(yg, yc, dtype, rtol=1e-4 if dtype == "float32" else 2e-2)
    (yc.float() ** 2).sum().backward()
    (yg.float() ** 2).sum().backward()
    for gg, gc in ((qg, q), (kg, k), (vg, v)):
        _same(gg.grad, gc.grad, dtype, rtol=1e-4 if dtype == "float32" else 3e-2)
    logits, logitsg = _pair((12, 70), dtype)
    targets = it.from_numpy(RNG.integers(0, 70, 12))
    _same(nn.functional.cross_entropy(logitsg, targets.to("cuda")), nn.functional.cross_entropy(logits, targets), dtype)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("vocab,padded", [(70, 72), (70, 70), (1001, 1024)])
def test_fused_cross_entropy_against_the_cpu(dtype, vocab, padded):
    """The fused softmax + cross-entropy kernels over a padded vocabulary (rows of whole vectors:
    16 bytes at a time, the padding never entering the softmax; or one at a time), with masked
    (-inf) logits, an ignored row and the gradient zero on the padding, against the CPU."""
    from infinitrain.kernels import neural as knn
    x = RNG.standard_normal((9, padded)).astype(np.float32) * 3
    x[2, :40] = -np.inf  # masked logits: the online softmax must not make NaN of them
    x[:, vocab:] = 1e4  # the padding: would dominate if it entered the softmax
    targets = RNG.integers(0, vocab, 9)
    targets[2], targets[5] = 50, -100  # a target the mask left alone; an ignored row
    logits, t = it.from_numpy(x).to(dtype), it.from_numpy(targets)
    loss_c, lse_c = knn.cross_entropy(logits, t, vocab=vocab)
    loss_g, lse_g = knn.cross_entropy(logits.to("cuda"), t.to("cuda"), vocab=vocab)
    _same(loss_g, loss_c, "float32", rtol=1e-5)
    _same(lse_g, lse_c, "float32", rtol=1e-5)
    dl = it.from_numpy(RNG.standard_normal(9).astype(np.float32))
    grad_c = knn.cross_entropy_backward(dl, logits, lse_c, t, vocab=vocab)
    grad_g = knn.cross_entropy_backward(dl.to("cuda"), logits.to("cuda"), lse_g, t.to("cuda"), vocab=vocab)
    _same(grad_g, grad_c, dtype)
    assert np.all(grad_g.cpu().float().numpy()[:, vocab:] == 0) and np.all(grad_g.cpu().float().numpy()[5] == 0)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("C,F", [(16, 24), (5, 7)])
def test_mixture_of_experts_kernels_against_the_cpu(dtype, C, F):
    """The routing sort, permutation, grouped products (cuBLAS's grouped call; one product per
    expert for rows not 16-byte aligned, 5 and 7 wide) and scatter back, values and gradients,
    an expert without tokens and a keep mask; an expert id out of range is reported when the
    counts come back to the host."""
    from infinitrain.ops import moe
    ids = it.from_numpy(np.stack([RNG.choice([0, 1, 3], 2, replace=False) for _ in range(11)]))  # expert 2: none
    keep = it.from_numpy(RNG.random((11, 2)) > 0.2)
    (x, xg), (gate, gateg) = _pair((11, C), dtype), _pair((11, 2), dtype, 0.1, 1.0)
    ws = [_pair((F, C), dtype) for _ in range(4)]
    results = []
    for device, xx, gg, ww in (("cpu", x, gate, [w for w, _ in ws]), ("cuda", xg, gateg, [w for _, w in ws])):
        for t in (xx, gg, *ww):
            t.requires_grad_()
        order = moe.sort_by_expert(ids.to(device), 4, keep.to(device))
        h = moe.grouped_linear(moe.permute(xx, order.rows), ww, order.counts)
        y = moe.unpermute(h, order.rows, gg.reshape(-1)[order.slots], 11)
        (y.float() ** 2).sum().backward()
        results.append((order, y, [xx.grad, gg.grad] + [w.grad for w in ww]))
    (oc, yc, gc), (og, yg, gg_) = results
    assert og.counts == oc.counts and oc.counts[2] == 0
    assert og.rows.cpu().tolist() == oc.rows.tolist() and og.slots.cpu().tolist() == oc.slots.tolist()
    rtol = 1e-4 if dtype != "bfloat16" else 3e-2
    _same(yg, yc, dtype, rtol=rtol)
    for a, b in zip(gg_, gc):
        _same(a, b, dtype, rtol=rtol)
    with pytest.raises(IndexError, match="index"):
        moe.sort_by_expert(it.tensor([[0, 4]], device="cuda"), 4)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("causal,Tq,Tk", [(True, 7, 13), (False, 9, 5)])
def test_attention_blocks_and_merge_against_the_cpu(dtype, causal, Tq, Tk):
    """The kernels context parallelism runs: queries and keys of different lengths, the
    bottom-right causal mask, a block's backward with the row's out and lse, the merge."""
    from infinitrain.kernels import neural as knn
    q, qg = _pair((2, 4, Tq, 16), dtype)
    k, kg = _pair((2, 2, Tk, 16), dtype)
    v, vg = _pair((2, 2, Tk, 16), dtype)
    g, gg = _pair((2, 4, Tq, 16), dtype)
    tol = 1e-4 if dtype == "float32" else 3e-2
    (oc, lc), (og, lg) = knn.attention(q, k, v, causal=causal), knn.attention(qg, kg, vg, causal=causal)
    _same(og, oc, dtype, rtol=tol)
    _same(lg, lc, "float32", rtol=1e-4)
    for a, b in zip(knn.attention_backward(gg, qg, kg, vg, og, lg, causal=causal),
                    knn.attention_backward(g, q, k, v, oc, lc, causal=causal)):
        _same(a, b, dtype, rtol=tol)
    merged = []
    for dev, (o, l_) in (("cpu", (oc, lc)), ("cuda", (og, lg))):
        out, lse = it.zeros(2, 4, 2 * Tq, 16, device=dev), it.full((2, 4, 2 * Tq), float("-inf"), device=dev)
        knn.attention_merge(out, lse, o, l_, row_offset=Tq)
        knn.attention_merge(out, lse, o, l_, row_offset=Tq)  # twice: the same block, lse + log 2
        merged.append((out, lse))
    _same(merged[1][0], merged[0][0], "float32", rtol=tol)
    _same(merged[1][1][:, :, Tq:], merged[0][1][:, :, Tq:], "float32", rtol=1e-5)
    assert np.all(np.isneginf(merged[1][1][:, :, :Tq].cpu().numpy()))  # rows no block reached


def _relative_error(gpu, cpu, scale=None):
    """|gpu - cpu| / |cpu| in L2, or / |scale| where cpu may be zero (a gradient that cancels)"""
    g, c = gpu.detach().cpu().float().numpy(), cpu.detach().float().numpy()
    assert np.isfinite(g).all()
    floor = np.linalg.norm(scale.numpy()) if scale is not None else 1e-30
    return float(np.linalg.norm(g - c) / max(np.linalg.norm(c), floor))


FLASH_CASES = [  # head size, Tq, Tk, causal, heads, kv heads
    (64, 130, 130, True, 4, 2),  # past two 64-row blocks and a partial key tile; grouped-query
    (64, 1, 1, True, 2, 2),  # one token
    (128, 65, 65, False, 2, 1),  # head size 128, not causal, one kv head
    (64, 7, 97, True, 2, 2),  # fewer queries than keys: the bottom-right diagonal (a CP block)
    (128, 33, 97, True, 4, 1),  # head size 128, causal, fewer queries than keys, one kv head
    (64, 97, 7, False, 2, 2),  # more queries than keys (not causal: the API refuses it causal)
    (128, 70, 200, False, 2, 2),  # not causal, Tq != Tk, four key tiles at head size 128
]


@needs_gpu
@pytest.mark.parametrize("kernels", ["wmma", "mma", "mma-dkv32"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("D,Tq,Tk,causal,H,KV", FLASH_CASES)
def test_tensor_core_attention_against_the_cpu_in_float32(dtype, D, Tq, Tk, causal, H, KV, kernels, monkeypatch):
    """The flash kernels (16-bit, head size 64 or 128; WMMA's, and mma.sync's with either dK/dV
    query tile) against the CPU's attention in float32 on the same 16-bit values: out, lse and
    the three gradients, within the error of 16-bit operands (relative L2 error 1e-2 bf16, 2e-3
    fp16, FlashAttention's tests' order)."""
    from infinitrain.kernels import neural as knn
    if kernels == "mma-dkv32" and (D != 64 or dtype != "bfloat16"):
        pytest.skip("the dK/dV tile variant exists at head size 64; one dtype shows it")
    monkeypatch.setenv("INFINITRAIN_CUDA_ATTENTION", kernels.split("-")[0])
    monkeypatch.setenv("INFINITRAIN_FLASH_DKV_TILE", "32" if kernels == "mma-dkv32" else "64")
    (q, qg), (k, kg), (v, vg) = (_pair((2, h, t, D), dtype) for h, t in ((H, Tq), (KV, Tk), (KV, Tk)))
    g, gg = _pair((2, H, Tq, D), dtype)
    q, k, v, g = (t.float() for t in (q, k, v, g))
    (oc, lc), (og, lg) = knn.attention(q, k, v, causal=causal), knn.attention(qg, kg, vg, causal=causal)
    tol = 1e-2 if dtype == "bfloat16" else 2e-3
    assert og.dtype == qg.dtype and _relative_error(og, oc) < tol
    seen = np.isfinite(lc.numpy())
    assert np.array_equal(np.isfinite(lg.cpu().numpy()), seen)  # -inf exactly where no key is seen
    np.testing.assert_allclose(lg.cpu().numpy()[seen], lc.numpy()[seen], rtol=1e-3, atol=1e-3)
    if not seen.all():
        assert np.all(og.cpu().float().numpy()[~seen] == 0)
    grads_c = knn.attention_backward(g, q, k, v, oc, lc, causal=causal)
    grads_g = knn.attention_backward(gg, qg, kg, vg, og, lg, causal=causal)
    for a, b in zip(grads_g, grads_c):
        assert a.dtype == qg.dtype and _relative_error(a, b, scale=g) < 2 * tol


@needs_gpu
@pytest.mark.parametrize("name,value,message", [
    ("INFINITRAIN_CUDA_ATTENTION", "flash2", "INFINITRAIN_CUDA_ATTENTION=flash2: expected reference, wmma or mma"),
    ("INFINITRAIN_FLASH_DKV_TILE", "48", "INFINITRAIN_FLASH_DKV_TILE=48: expected 32 or 64")])
def test_an_unknown_attention_kernel_setting_is_refused_by_name(monkeypatch, name, value, message):
    from infinitrain.kernels import neural as knn
    q = it.zeros((1, 2, 8, 64), dtype="bfloat16", device="cuda")
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        knn.attention(q, q, q, causal=True)


@needs_gpu
@pytest.mark.slow
def test_16_bit_attention_runs_on_the_tensor_core_kernels():
    """The routing: the same call with INFINITRAIN_CUDA_ATTENTION=reference (the row kernels)
    gives other bits (the flash kernels round probabilities to 16 bits before P V), both close;
    =wmma (the WMMA flash kernels, kept beside the default mma.sync ones) is close too."""
    code = ("import numpy as np, infinitrain as it; from infinitrain.kernels import neural as knn;"
            "r = np.random.default_rng(0); q, k, v = (it.from_numpy(r.uniform(-2, 2, (1, 2, 70, 64))"
            ".astype(np.float32)).to('bfloat16').to('cuda') for _ in range(3));"
            "o, _ = knn.attention(q, k, v); print(o.float().cpu().numpy().tobytes().hex())")
    flash = run([sys.executable, "-c", code], check=True).stdout.strip()
    reference = run([sys.executable, "-c", code], check=True,
                    env=dict(ENV, INFINITRAIN_CUDA_ATTENTION="reference")).stdout.strip()
    wmma = run([sys.executable, "-c", code], check=True,
               env=dict(ENV, INFINITRAIN_CUDA_ATTENTION="wmma")).stdout.strip()
    a, b, c = (np.frombuffer(bytes.fromhex(x), np.float32) for x in (flash, reference, wmma))
    assert not np.array_equal(a, b) and np.abs(a - b).max() < 0.05 and np.abs(a - c).max() < 0.05


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_masked_attention_with_dropout_against_the_cpu(dtype):
    """General attention on the GPU: cross attention (L != S), a key-padding mask that masks one
    sample's every key, an additive float mask, and dropout: the same hash of the same seed
    drops the same probabilities on both devices, forward and backward."""
    L, S = 6, 9
    q, qg = _pair((2, 4, L, 16), dtype)
    k, kg = _pair((2, 2, S, 16), dtype)
    v, vg = _pair((2, 2, S, 16), dtype)
    pad = RNG.random((2, 1, 1, S)) > 0.3
    pad[1] = False  # sample 1: nothing to attend to (zeros out, no gradient)
    additive = RNG.standard_normal((L, S)).astype(np.float32)
    for mask in (pad, additive):
        for t in (q, k, v, qg, kg, vg):
            t.grad = None
            t.requires_grad_()
        ys = []
        for qq, kk, vv, dev in ((q, k, v, "cpu"), (qg, kg, vg, "cuda")):
            it.manual_seed(7)
            y = nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=it.tensor(mask, device=dev),
                                                           dropout_p=0.25, enable_gqa=True)
            (y.float() ** 2).sum().backward()
            ys.append(y)
        tol = 1e-4 if dtype == "float32" else 3e-2
        _same(ys[1], ys[0], dtype, rtol=tol)
        for gg, gc in ((qg, q), (kg, k), (vg, v)):
            _same(gg.grad, gc.grad, dtype, rtol=tol)


@needs_gpu
def test_tensors_made_from_data_on_cuda():
    a = it.tensor([[1.5, -2.0]], device="cuda")
    b = it.tensor(a, dtype=it.bfloat16)
    c = it.tensor(it.arange(3), device="cuda:0")
    assert a.device == "cuda:0" and b.device == "cuda:0" and c.device == "cuda:0"
    assert a.tolist() == [[1.5, -2.0]] and b.float().tolist() == [[1.5, -2.0]] and c.tolist() == [0, 1, 2]
    assert it.allclose(a, a.cpu().to("cuda"))
    for layer in (nn.Linear(4, 3, device="cuda"), nn.Embedding(5, 4, device="cuda"), nn.LayerNorm(4, device="cuda"),
                  nn.RMSNorm(4, device="cuda", dtype=it.bfloat16)):  # PyTorch's factory keywords
        assert all(p.device == "cuda:0" for p in layer.parameters()), layer


@needs_gpu
def test_non_blocking_copies_between_pinned_memory_and_a_gpu_are_queued_on_the_stream():
    """pin_memory() and copy_(non_blocking=True), as PyTorch's: between pinned host memory and a
    GPU the copy is queued on the current stream (the host must wait for the stream before it
    reads the result or reuses the source); pageable memory, another dtype or a strided view
    copies at once; the arguments are checked before CUDA sees them."""
    g = it.arange(6.0).to("cuda")
    host = it.zeros(6).pin_memory()
    assert host.is_pinned() and host.pin_memory() is host and not it.zeros(6).is_pinned()
    assert host.device == "cpu" and host.tolist() == [0.0] * 6
    stream, written = it.cuda.Stream(), it.cuda.Event()
    written.record()  # g as the current stream leaves it
    stream.wait_event(written)
    with it.cuda.stream(stream):
        host.copy_(g, non_blocking=True)
    done = stream.record_event()
    done.synchronize()
    assert host.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    up = it.full((6,), 7.0).pin_memory()
    g.copy_(up, non_blocking=True)
    it.cuda.synchronize()
    assert g.tolist() == [7.0] * 6
    pageable = it.zeros(6)
    pageable.copy_(g, non_blocking=True)  # not pinned: copied at once, readable now
    assert pageable.tolist() == [7.0] * 6
    halves = it.zeros(6, dtype=it.bfloat16).pin_memory()
    halves.copy_(g, non_blocking=True)  # a cast: made at once
    assert halves.float().tolist() == [7.0] * 6
    with pytest.raises(RuntimeError, match="only host memory is pinned"):
        g.pin_memory()
    cpu0, cuda0 = ffi.new("it_device *", [lib.IT_CPU, 0])[0], ffi.new("it_device *", [lib.IT_CUDA, 0])[0]
    p = ffi.cast("void *", host.data_ptr())
    assert lib.it_memcpy_async(cuda0, ffi.NULL, cpu0, p, 8, ffi.NULL) == lib.IT_ERR_INVALID_ARGUMENT
    cuda1 = ffi.new("it_device *", [lib.IT_CUDA, 1])[0]
    assert lib.it_memcpy_async(cuda1, p, cuda0, p, 8, ffi.NULL) == lib.IT_ERR_INVALID_ARGUMENT
    assert "use it_memcpy" in ffi.string(lib.it_last_error()).decode()


@needs_gpu
def test_stream_blocks_nest_and_restore_the_stream_before():
    """As PyTorch's: after an inner `with stream(b)` work goes to the outer block's stream a
    again, not to the device's own (on the emulated GPU, where streams run only when waited on,
    a copy queued on the wrong stream would never land)."""
    g = it.arange(4.0).to("cuda")
    host = it.zeros(4).pin_memory()
    a, b = it.cuda.Stream(), it.cuda.Stream()
    ready = it.cuda.Event()
    ready.record()
    a.wait_event(ready)
    with it.cuda.stream(a):
        with it.cuda.stream(b):
            pass
        host.copy_(g, non_blocking=True)  # on a
    a.synchronize()
    assert host.tolist() == [0.0, 1.0, 2.0, 3.0]


@needs_gpu
def test_tiny_gpt2_trains_on_cuda_as_on_the_cpu():
    from infinitrain.models import GPT2Config
    from infinitrain.models.gpt2 import GPT2
    from infinitrain.optim import AdamW
    losses = {}
    for device in ("cpu", "cuda"):
        model = GPT2(GPT2Config(block_size=32, vocab_size=300, n_layer=2, n_head=4, n_embd=32), seed=3).to(device)
        opt = AdamW(model.parameters(), lr=1e-2)
        out = []
        for step in range(10):
            data = np.random.default_rng(step % 2).integers(0, 300, (4, 17))
            x, y = (it.from_numpy(data[:, :-1].copy()).to(device), it.from_numpy(data[:, 1:].copy()).to(device))
            _, loss = model(x, y, return_logits=False)
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
        losses[device] = out
    np.testing.assert_allclose(losses["cuda"], losses["cpu"], rtol=1e-4)


@needs_gpu
@pytest.mark.parametrize("device", ["cpu", "nvme"])
def test_offloaded_optimizer_state_trains_a_gpu_model_as_the_gpu_optimizer(tmp_path, device):
    """OffloadOptimizer on a GPU: the state in host memory (or on disk), the gradients copied to
    the host, the CPU's AdamW kernel, the weights copied back: the same bits as the GPU's own
    AdamW (the two kernels compute the same float32 expression)."""
    from infinitrain.models import GPT2Config
    from infinitrain.models.gpt2 import GPT2
    from infinitrain.optim import AdamW, OffloadOptimizer
    runs = {}
    for offload in (None, device):
        model = GPT2(GPT2Config(block_size=32, vocab_size=300, n_layer=2, n_head=4, n_embd=32), seed=3).to("cuda")
        opt = AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        if offload:
            opt = OffloadOptimizer(opt, offload, path=tmp_path)
        out = []
        for step in range(5):
            data = np.random.default_rng(step % 2).integers(0, 300, (4, 17))
            x, y = (it.from_numpy(data[:, :-1].copy()).to("cuda"), it.from_numpy(data[:, 1:].copy()).to("cuda"))
            _, loss = model(x, y, return_logits=False)
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
        runs[offload] = out, [p.detach().cpu().numpy() for p in model.parameters()]
        if offload:
            state = opt.state_dict()["state"][0]
            assert state["step"] == 5 and state["exp_avg"].device.type == "cuda"
    assert runs[device][0] == runs[None][0]
    for a, b in zip(runs[device][1], runs[None][1]):
        np.testing.assert_array_equal(a, b)


@needs_gpu
def test_offloaded_steps_read_back_only_weights_written_behind_their_back():
    """The host keeps the master weights between steps: a step reads a GPU weight back only when
    something else wrote it since the last step copied it there (a loaded checkpoint, an in-place
    edit: its storage's version moved), and then updates the value written, as the GPU's own AdamW
    does (the same bits)."""
    from infinitrain.optim import AdamW, OffloadOptimizer
    runs = []
    for offload in (False, True):
        it.manual_seed(0)
        model = nn.Linear(8, 4).to("cuda")
        opt = AdamW(model.parameters(), lr=1e-2)
        opt = OffloadOptimizer(opt, "cpu") if offload else opt
        x = it.randn(3, 8).to("cuda")
        for step in range(3):
            model(x).square().sum().backward()
            opt.step()
            opt.zero_grad()
            if offload:
                assert all(opt._pushed[i] == opt._written(i) for i in range(2)), "a weight the step wrote looks foreign"
            if step == 1:
                with it.no_grad():
                    model.weight.mul_(0.5)  # written behind the optimizer's back: the next step must see it
                if offload:
                    assert opt._pushed[0] != opt._written(0) and opt._pushed[1] == opt._written(1)
        runs.append([p.detach().cpu().numpy() for p in model.parameters()])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


ZERO3_OFFLOAD = """
import sys
import numpy as np
import infinitrain as it
from infinitrain.models import GPT2Config
from infinitrain.models.gpt2 import GPT2
from infinitrain.nn import parallel
from infinitrain.nn.parallel.train_step import TrainStep
from infinitrain.optim import AdamW
env = parallel.init(device="cuda")
runs = []
for offload in ("none", "cpu"):
    model = GPT2(GPT2Config(block_size=32, vocab_size=300, n_layer=2, n_head=4, n_embd=32), seed=3).to("cuda")
    plan = parallel.ParallelPlan(env, zero_stage=3 if offload != "none" else 0, offload_optimizer=offload,
                                 offload_param=offload)
    trainer = TrainStep(model, plan, model.parameters(), AdamW, lr=1e-2, weight_decay=0.1)
    losses = []
    for step in range(4):
        data = np.random.default_rng(step % 2).integers(0, 300, (4, 17))
        x, y = (it.from_numpy(data[:, :-1].copy()).to("cuda"), it.from_numpy(data[:, 1:].copy()).to("cuda"))
        losses.append(trainer.step([(x, y)])[0])
    with trainer.gathered_parameters():
        runs.append((losses, [p.detach().cpu().numpy().copy() for p in model.parameters()]))
    if offload != "none":
        pieces = trainer.optimizer.offloaded_pieces
        assert all(b.shard_param._storage.is_released for b in pieces.buckets), "a piece stayed on the GPU"
assert runs[0][0] == runs[1][0], runs
assert all(np.array_equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
print("OK", runs[1][0])
"""


STREAMING = Path(__file__).parent / "offload_streaming.py"


@pytest.mark.slow
@needs_gpu
@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_gradients_stream_to_the_host_during_backward_with_the_same_bits(model):
    """offload_optimizer="cpu" on one GPU: each gradient's copy to pinned host memory is queued
    from its own hook during the step's last backward (ZeRO-Offload's schedule), clipping's
    factor follows the copies, and training gives the bits of the GPU optimizer (see the
    script; DP, ZeRO and TP over NCCL in test_cuda_emulated.py)."""
    out = mpirun(1, [STREAMING, "--model", model], check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    ok, streamed, everything = out.stdout.split()[-3:]
    assert ok == "OK" and int(streamed) == int(everything) > 0, out.stdout  # every gradient, during backward


@pytest.mark.slow
@needs_gpu
def test_zero3_with_parameters_in_host_memory_trains_as_the_gpu_alone():
    """ZeRO-3 on one GPU with offload_param and offload_optimizer "cpu" (ZeRO-Infinity's single
    device): the pieces of the parameters and the AdamW state in host memory, each unit's piece
    copied up for its gather and dropped after; the losses and weights of plain training, bit
    for bit."""
    out = mpirun(1, ["-c", ZERO3_OFFLOAD], check=False)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr


# ---- NCCL -----------------------------------------------------------------------------------
def test_communicator_arguments_are_checked_before_nccl():
    cpu = ffi.new("it_device *", [lib.IT_CPU, 0])[0]
    cuda0 = ffi.new("it_device *", [lib.IT_CUDA, 0])[0]
    buf = ffi.new("uint8_t[128]")
    assert lib.it_comm_unique_id(cpu, buf, 128) == lib.IT_ERR_NOT_SUPPORTED
    assert "CPU tensors use MPI" in ffi.string(lib.it_last_error()).decode()
    assert lib.it_comm_unique_id(cuda0, buf, 16) == lib.IT_ERR_INVALID_ARGUMENT
    out = ffi.new("it_comm **")
    assert lib.it_comm_init(cuda0, buf, 128, 2, 5, out) == lib.IT_ERR_INVALID_ARGUMENT and out[0] == ffi.NULL
    assert lib.it_comm_all_reduce(ffi.NULL, lib.IT_FLOAT32, buf, buf, 1, lib.IT_COMM_SUM, ffi.NULL) == \
        lib.IT_ERR_INVALID_ARGUMENT
    counts = ffi.new("int64_t[2]", [1, 1])
    assert lib.it_comm_all_to_all(ffi.NULL, lib.IT_FLOAT32, buf, 2, counts, counts, buf, 2, counts, counts,
                                  ffi.NULL) == lib.IT_ERR_INVALID_ARGUMENT
    if not GPU:  # checked, then NCCL (or the device) is found missing, saying so
        st = lib.it_comm_init(cuda0, buf, 128, 2, 0, out)
        assert st in (lib.IT_ERR_NO_CUDA, lib.IT_ERR_NCCL), st
        assert "it_comm_init: " in ffi.string(lib.it_last_error()).decode()


@pytest.mark.slow
@pytest.mark.skipif(GPU, reason="a GPU is present")
def test_cuda_layouts_and_examples_without_a_gpu_say_why():
    code = "from infinitrain.nn import parallel; parallel.init(device='cuda')"
    out = mpirun(1, ["-c", code], timeout=60, check=False)
    assert out.returncode != 0 and "no usable CUDA device" in out.stderr, out.stderr
    out = example(1, "gpt2", ["--device", "cuda"], timeout=60, check=False)
    assert out.returncode != 0 and out.stderr.startswith("--device cuda: ") and "Traceback" not in out.stderr
    assert "no usable CUDA device" in out.stderr


def test_pipeline_links():
    """Over NCCL each directed link a pipeline sends on is a communicator of its own: the list
    of links for GPipe/1F1B (no wrap-around) and for virtual chunks (the last stage feeds the
    first)."""
    from infinitrain.nn.parallel.pp.p2p import links
    assert links(2, 1) == [(0, 1, 0), (1, 0, 1)]
    assert links(3, 1) == [(0, 1, 0), (1, 0, 1), (1, 2, 0), (2, 1, 1)]
    assert links(2, 2) == [(0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1)]
    assert links(4, 2) == sorted([(s, (s + 1) % 4, 0) for s in range(4)] + [((s + 1) % 4, s, 1) for s in range(4)])
    # an NCCL group (made without a GPU: no communicator) refuses a tag whose link is not open
    from infinitrain.nn.parallel.nccl import NCCLProcessGroup
    group = NCCLProcessGroup.__new__(NCCLProcessGroup)
    group.rank, group.size, group._links = 0, 2, {}
    assert group._link(0, 1, 0) is None  # tag 0 without links: the group's own communicator
    with pytest.raises(ValueError, match="NCCL has no tags: open the link 0 -> 1 with tag 1"):
        group._link(0, 1, 1)


@pytest.mark.slow
@needs_gpu
@pytest.mark.parametrize("example,dtype,steps,rtol", [("gpt2", "float32", 6, 1e-4),
                                                     ("llama3", "bfloat16", 3, 1e-2)])
def test_the_example_trains_on_cuda_as_on_the_cpu(tmp_path, example, dtype, steps, rtol):
    """`python -m infinitrain.examples.<example> --device cuda`: the same losses as on the CPU
    (both start from the same host-initialised weights). LLaMA-3 in bf16 adds RoPE, RMSNorm,
    SwiGLU and grouped-query attention on 16-bit tensors."""
    from infinitrain.data import write_shard
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 300), 40))
    base = ["-m", f"infinitrain.examples.{example}", "--input_bin", tmp_path / "t.bin",
            "--model", "tiny", "--batch_size", "2", "--sequence_length", "32", "--num_iteration", str(steps),
            "--learning_rate", "3e-3", "--total_batch_size", "128", "--peak_tflops", "1", "--dtype", dtype]
    runs = {}
    for device in ("cpu", "cuda"):
        out = mpirun(1, base + ["--device", device], check=False)  # `example` is this test's parameter
        assert out.returncode == 0, out.stdout + out.stderr
        runs[device] = step_losses(out.stdout)
    assert len(runs["cpu"]) == steps
    np.testing.assert_allclose(runs["cuda"], runs["cpu"], rtol=rtol)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2])
def test_nccl_collectives(n):
    """One rank per GPU: the id made on rank 0 and broadcast over MPI, every collective against
    its known answer (one GPU: a communicator of one rank, which still runs each NCCL call)."""
    if it.cuda.device_count() < n:
        pytest.skip(f"needs {n} GPU(s)")
    out = run([*launch(n), sys.executable, MPI_SCRIPTS / "nccl_collectives.py"])  # mpiexec, one rank too
    assert out.returncode == 0 and out.stdout.count(" OK") == n, out.stdout + out.stderr


@needs_gpu
def test_cuda_tensors_go_through_dlpack_and_the_cuda_array_interface_without_a_copy():
    """Our CUDA tensor read back through DLPack and through __cuda_array_interface__ (as CuPy,
    pycuda or Numba hand theirs over): the same memory on the same device."""
    t = it.tensor([1.0, 2.0, 3.0], device="cuda")
    assert t.__dlpack_device__() == (2, t.device.index or 0)
    back = it.from_dlpack(t.__dlpack__())
    assert back.device == t.device and back.data_ptr() == t.data_ptr() and back.tolist() == [1.0, 2.0, 3.0]

    class Foreign:  # another library's CUDA array
        __cuda_array_interface__ = t.__cuda_array_interface__
    shared = it.as_tensor(Foreign())
    assert shared.device.type == "cuda" and shared.data_ptr() == t.data_ptr()
    shared.fill_(5.0)
    assert t.tolist() == [5.0, 5.0, 5.0]


@needs_gpu
@pytest.mark.parametrize("library", ["torch", "cupy", "pycuda"])
def test_the_gpu_python_ecosystem_shares_memory_both_ways(library):
    """PyTorch and CuPy through DLPack, pycuda's GPUArray through __cuda_array_interface__ (pycuda
    speaks no DLPack). Needs a real GPU and the library: skipped on the emulated GPU."""
    lib = pytest.importorskip(library)
    t = it.tensor([1.0, 2.0, 3.0], device="cuda")
    if library == "torch":
        if not lib.cuda.is_available():
            pytest.skip("PyTorch sees no GPU")
        theirs = lib.from_dlpack(t)
        assert theirs.data_ptr() == t.data_ptr()
        ours = it.from_dlpack(lib.arange(3.0, device="cuda"))
    elif library == "cupy":
        theirs = lib.from_dlpack(t)
        assert theirs.data.ptr == t.data_ptr()
        ours = it.from_dlpack(lib.arange(3.0, dtype=lib.float32))
    else:
        import pycuda.autoprimaryctx  # noqa: F401  (the primary context, the one CUDA runtime users share)
        import pycuda.gpuarray as gpuarray
        import numpy as np
        theirs = gpuarray.GPUArray((3,), np.float32, gpudata=t.data_ptr())
        assert theirs.get().tolist() == [1.0, 2.0, 3.0]
        ours = it.as_tensor(gpuarray.to_gpu(np.arange(3.0, dtype=np.float32)))
    assert ours.device.type == "cuda" and ours.tolist() == [0.0, 1.0, 2.0]
