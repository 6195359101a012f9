"""Tensor metadata, views, factories, numpy interop and operators."""
import numpy as np
import pytest

import infinitrain as it


def test_factories(rng):
    assert it.zeros(2, 3).numpy().tolist() == [[0, 0, 0], [0, 0, 0]]
    assert it.ones((2,)).dtype is it.float32
    assert np.all(it.full((2, 2), 7.5).numpy() == 7.5)
    assert it.full((3,), 4).dtype is it.int64
    np.testing.assert_array_equal(it.arange(5).numpy(), np.arange(5))
    np.testing.assert_allclose(it.arange(0, 1, 0.25).numpy(), [0, 0.25, 0.5, 0.75])
    assert it.arange(10, 0, -3).numpy().tolist() == [10, 7, 4, 1]
    assert it.empty(0, 4).shape == (0, 4)
    t = it.tensor([[1.5, 2.0], [3.0, 4.0]])
    assert t.dtype is it.float32 and t.shape == (2, 2) and t[1, 0].item() == 3.0
    assert it.tensor([1, 2, 3]).dtype is it.int64
    assert it.tensor([1.0, 2.0], dtype=it.bfloat16).dtype is it.bfloat16
    assert it.zeros_like(t).shape == t.shape and it.ones_like(t, dtype=it.int32).dtype is it.int32


def test_from_numpy_shares_memory_both_ways():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = it.from_numpy(a)
    assert t.data_ptr() == a.ctypes.data
    t[1] = -1.0
    assert a[1].tolist() == [-1, -1, -1, -1]
    a[2, 3] = 99
    assert t[2, 3].item() == 99
    back = t.numpy()
    assert back.ctypes.data == a.ctypes.data
    # a strided numpy view keeps its strides
    s = it.from_numpy(a[:, ::2])
    assert s.shape == (3, 2) and s.stride() == (4, 2)
    np.testing.assert_array_equal(s.numpy(), a[:, ::2])


def test_from_numpy_dtypes():
    import ml_dtypes
    for np_dt, dt in [(np.float32, it.float32), (np.float16, it.float16), (np.int32, it.int32),
                      (np.int64, it.int64), (np.uint8, it.uint8), (ml_dtypes.bfloat16, it.bfloat16)]:
        a = np.arange(6).astype(np_dt)
        t = it.from_numpy(a)
        assert t.dtype is dt
        assert t.numpy().dtype == np.dtype(np_dt)
        np.testing.assert_array_equal(t.numpy(), a)
    assert it.from_numpy(np.zeros(3)).dtype is it.float64
    assert it.from_numpy(np.zeros(3, dtype=bool)).dtype is it.bool
    with pytest.raises(TypeError, match="complex128"):
        it.from_numpy(np.zeros(3, dtype=np.complex128))
    with pytest.raises(ValueError, match="negative"):
        it.from_numpy(np.arange(4, dtype=np.float32)[::-1])


def test_numpy_outlives_tensor():
    t = it.arange(1000, dtype=it.float32)
    a = t.numpy()
    del t
    import gc
    gc.collect()
    it.zeros(1000)  # would reuse the block if the storage had been freed
    assert a[999] == 999.0


def test_views(rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    t = it.from_numpy(a)
    np.testing.assert_array_equal(t.view(6, 4).numpy(), a.reshape(6, 4))
    np.testing.assert_array_equal(t.reshape(-1).numpy(), a.reshape(-1))
    np.testing.assert_array_equal(t.transpose(0, 2).numpy(), a.transpose(2, 1, 0))
    np.testing.assert_array_equal(t.permute(1, 2, 0).numpy(), a.transpose(1, 2, 0))
    np.testing.assert_array_equal(t.permute(1, 2, 0).contiguous().numpy(), a.transpose(1, 2, 0))
    assert t.permute(1, 2, 0).contiguous().is_contiguous()
    assert not t.transpose(0, 1).is_contiguous()
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        t.transpose(0, 1).view(-1)
    np.testing.assert_array_equal(t.transpose(0, 1).reshape(3, 8).numpy(),
                                  a.transpose(1, 0, 2).reshape(3, 8))
    np.testing.assert_array_equal(t[1, :, 1:3].numpy(), a[1, :, 1:3])
    np.testing.assert_array_equal(t[..., ::2].numpy(), a[..., ::2])
    np.testing.assert_array_equal(t[:, None, -1].numpy(), a[:, None, -1])
    np.testing.assert_array_equal(t[-1].numpy(), a[-1])
    np.testing.assert_array_equal(t.unsqueeze(1).numpy(), a[:, None])
    np.testing.assert_array_equal(t[:, :1].squeeze(1).numpy(), a[:, 0])
    np.testing.assert_array_equal(t[:, :1].expand(2, 5, 4).numpy(),
                                  np.broadcast_to(a[:, :1], (2, 5, 4)))
    np.testing.assert_array_equal(t.narrow(2, 1, 2).numpy(), a[:, :, 1:3])
    parts = t.split([1, 3], dim=2)
    np.testing.assert_array_equal(parts[1].numpy(), a[:, :, 1:])
    assert [p.shape[1] for p in t.chunk(2, 1)] == [2, 1]
    np.testing.assert_array_equal(t.flatten(1).numpy(), a.reshape(2, 12))
    np.testing.assert_array_equal(t.T.numpy(), a.T)
    with pytest.raises(IndexError):
        t[2]
    with pytest.raises(ValueError, match="invalid"):
        t.view(5, 5)


def test_setitem_and_copy(rng):
    t = it.zeros(3, 4)
    t[1:, 2] = 5.0
    t[0] = it.tensor([1.0, 2.0, 3.0, 4.0])
    t[:, 0] = it.tensor([7.0])  # broadcast
    expected = np.zeros((3, 4), np.float32)
    expected[1:, 2] = 5
    expected[0] = [1, 2, 3, 4]
    expected[:, 0] = 7
    np.testing.assert_array_equal(t.numpy(), expected)
    # overlapping copy within one storage reads the source before writing
    u = it.arange(6, dtype=it.float32)
    u[1:] = u[:-1]
    assert u.numpy().tolist() == [0, 0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="broadcast"):
        t[0] = it.zeros(3)


def test_integer_index_tensor(rng):
    a = rng.standard_normal((5, 3)).astype(np.float32)
    idx = np.array([[4, 0], [2, 2]])
    out = it.from_numpy(a)[it.tensor(idx)]
    np.testing.assert_array_equal(out.numpy(), a[idx])


def test_operators(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((4,)).astype(np.float32)
    ta, tb = it.from_numpy(a), it.from_numpy(b)
    np.testing.assert_allclose((ta + tb).numpy(), a + b)
    np.testing.assert_allclose((ta - tb).numpy(), a - b)
    np.testing.assert_allclose((ta * tb).numpy(), a * b)
    np.testing.assert_allclose((ta / tb).numpy(), a / b, rtol=1e-6)
    np.testing.assert_allclose((2.0 - ta).numpy(), 2 - a)
    np.testing.assert_allclose((ta / 3.0).numpy(), a / np.float32(3), rtol=1e-7)
    np.testing.assert_allclose((3.0 / ta).numpy(), 3 / a, rtol=1e-6)
    np.testing.assert_allclose((ta ** 2).numpy(), a ** 2, rtol=1e-6)
    np.testing.assert_allclose((-ta).numpy(), -a)
    np.testing.assert_allclose(ta.clamp(min=-0.5, max=0.5).numpy(), np.clip(a, -0.5, 0.5))
    c = ta.clone()
    c += 1
    c *= 2
    np.testing.assert_allclose(c.numpy(), (a + 1) * 2)
    i = it.tensor([1, 2, 3])
    assert (i + 1).numpy().tolist() == [2, 3, 4] and (i + 1).dtype is it.int64
    assert (i * i).numpy().tolist() == [1, 4, 9]
    np.testing.assert_allclose((i / 2).numpy(), [0.5, 1, 1.5])
    assert (i / 2).dtype is it.float32


def test_dtype_conversion_and_repr():
    t = it.tensor([1.0, 2.5, -3.0])
    assert t.to(it.int64).numpy().tolist() == [1, 2, -3]
    assert t.bfloat16().float().numpy().tolist() == [1.0, 2.5, -3.0]
    assert "bfloat16" in repr(t.bfloat16())
    assert repr(it.tensor([1.0, 2.0])) == "tensor([1., 2.])"
    assert t.to("cpu") is t


def test_item_and_len():
    t = it.tensor([[3.5]])
    assert t.item() == 3.5 and float(t) == 3.5 and len(t) == 1
    with pytest.raises(ValueError, match="one element"):
        it.zeros(2).item()
