"""Random numbers, thread-count independence, error paths, CUDA absence and the C host."""
import os
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

import infinitrain as it
from infinitrain._native import ffi, lib
from infinitrain.kernels import neural as nn
from helpers import ROOT, mpirun, run



def test_random_is_seeded_and_advances():
    it.manual_seed(123)
    a = it.randn(1000)
    b = it.randn(1000)
    it.manual_seed(123)
    np.testing.assert_array_equal(it.randn(1000).numpy(), a.numpy())
    assert not np.array_equal(a.numpy(), b.numpy())
    g = it.Generator(5)
    state = g.get_state()
    x = it.rand(10, generator=g)
    g.set_state(state)
    np.testing.assert_array_equal(it.rand(10, generator=g).numpy(), x.numpy())


def test_random_statistics():
    it.manual_seed(0)
    n = 200_000
    u = it.rand(n).numpy()
    z = it.randn(n).numpy()
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    assert abs(np.corrcoef(z[:-1], z[1:])[0, 1]) < 0.01
    b = it.randn(n, dtype=it.bfloat16).numpy().astype(np.float32)
    assert abs(b.std() - 1) < 0.02


def _run_with_threads(n: int, code: str) -> str:
    return mpirun(1, ["-c", code], timeout=120, env=dict(os.environ, OMP_NUM_THREADS=str(n)), cwd=ROOT)


@pytest.mark.slow
def test_results_do_not_depend_on_thread_count():
    """The same inputs give bit-identical outputs with 1 and 2 OpenMP threads."""
    code = textwrap.dedent("""
        import hashlib, numpy as np, infinitrain as it
        from infinitrain.kernels import neural as nn
        it.manual_seed(0)
        x = it.randn(300, 768); w = it.randn(768); b = it.randn(768); g = it.randn(300, 768)
        out, mean, rstd = nn.layer_norm(x, w, b)
        dx, dw, db = nn.layer_norm_backward(g, x, w, mean, rstd)
        q, k, v = it.randn(2, 4, 33, 16), it.randn(2, 2, 33, 16), it.randn(2, 2, 33, 16)
        o, lse = nn.attention(q, k, v)
        grads = nn.attention_backward(q, q, k, v, o, lse)
        idx = it.tensor(np.arange(3000) % 7)
        dwte = nn.embedding_backward(it.zeros(7, 768), it.randn(3000, 768), idx)
        big = it.randn(1_000_003)
        losses, _ = nn.cross_entropy(it.randn(64, 1000), it.tensor(np.arange(64)))
        h = hashlib.sha256()
        for t in [out, dx, dw, db, o, *grads, dwte, big.sum(), big.mean(), losses, it.rand(100_001)]:
            h.update(t.numpy().tobytes())
        print(it.get_num_threads(), h.hexdigest())
    """)
    one, two = _run_with_threads(1, code).split(), _run_with_threads(2, code).split()
    assert (one[0], two[0]) == ("1", "2")
    assert one[1] == two[1]


def test_native_errors_are_statuses_with_messages():
    cpu = it.device("cpu").native
    st = lib.it_layernorm_forward(cpu, lib.IT_FLOAT32, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL,
                                  ffi.NULL, ffi.NULL, 4, -1, 1e-5)
    assert st == lib.IT_ERR_INVALID_ARGUMENT
    assert "normalised dimension must be > 0" in ffi.string(lib.it_last_error()).decode()
    st = lib.it_unary(cpu, lib.IT_EXP, 99, ffi.NULL, ffi.NULL, 4)
    assert st == lib.IT_ERR_NOT_SUPPORTED
    assert "dtype unknown is not supported" in ffi.string(lib.it_last_error()).decode()
    st = lib.it_fill(cpu, lib.IT_FLOAT32, ffi.NULL, 0.0, -5)
    assert st == lib.IT_ERR_INVALID_ARGUMENT
    st = lib.it_unary(cpu, lib.IT_EXP, lib.IT_INT64, ffi.NULL, ffi.NULL, 4)
    assert st == lib.IT_ERR_NOT_SUPPORTED
    st = lib.it_copy_strided(cpu, lib.IT_FLOAT32, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, 40)
    assert st == lib.IT_ERR_INVALID_ARGUMENT
    st = lib.it_set_num_threads(0)
    assert st == lib.IT_ERR_INVALID_ARGUMENT
    with pytest.raises(it.InvalidArgumentError, match=r"must be in \[1, 1024\], got 0"):
        it.set_num_threads(0)
    assert ffi.string(lib.it_status_name(lib.IT_ERR_NO_CUDA)) == b"IT_ERR_NO_CUDA"


def test_python_errors_name_both_sides():
    with pytest.raises(ValueError, match=r"shapes \(2, 3\) and \(4,\) cannot be broadcast"):
        it.zeros(2, 3) + it.zeros(4)
    assert (it.tensor([1, 2]) * it.zeros(2)).dtype is it.float32  # promoted, as in PyTorch
    with pytest.raises(TypeError, match="left is int64 but right is float32"):
        from infinitrain.kernels import elementwise
        elementwise.binary(it._native.lib.IT_MUL, it.tensor([1, 2]), it.zeros(2))
    assert (it.zeros(2) * it.zeros(2, dtype=it.bfloat16)).dtype is it.float32  # promoted
    assert it.tensor([1, 2]).exp().dtype is it.float32  # as torch.exp
    with pytest.raises(TypeError, match="input must be a floating-point tensor, got int64"):
        from infinitrain.kernels import elementwise
        elementwise.unary(it._native.lib.IT_EXP, it.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"has shape \(5,\), expected \(4,\)"):
        nn.layer_norm(it.zeros(3, 4), it.zeros(5), None)
    with pytest.raises(TypeError, match="unknown dtype"):
        it.zeros(2, dtype="float128")
    with pytest.raises(ValueError, match="negative dimension"):
        it.zeros(2, -1)
    with pytest.raises(ValueError, match="unknown device type"):
        it.zeros(2, device="tpu")


@pytest.mark.slow
def test_c_host_builds_and_runs(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    from infinitrain import config
    exe = tmp_path / "c_host"
    cmd = [cc, str(ROOT / "examples" / "c_host" / "main.c"), *config.cflags().split(),
           *config.libs().split(), "-o", str(exe)]
    run(cmd, check=True)
    out = run([exe], timeout=60)
    assert out.returncode == 0, out.stderr
    assert "layernorm: mean 0.000000, mean square 0.99" in out.stdout
    assert "bad call -> IT_ERR_INVALID_ARGUMENT" in out.stdout
    # the header really is the installed one next to the installed library
    assert (Path(config.cflags()[2:]) / "infinitrain.h").is_file()
