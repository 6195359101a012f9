"""DLPack both ways without a copy (infinitrain.dlpack): numpy and PyTorch read our tensors and
we read theirs, sharing the memory (writes show through, strides and dtypes kept), and the
memory lives exactly as long as either side holds it. On a GPU the same holds for CUDA tensors
(pycuda, CuPy, PyTorch): those cases need one."""
import gc

import numpy as np
import pytest

import infinitrain as it
from infinitrain import dlpack

DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.bool_]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_reads_our_tensors_and_we_read_numpys_sharing_memory(dtype):
    base = (np.arange(12) % 5).astype(dtype).reshape(3, 4)
    t = it.from_dlpack(base)
    assert t.dtype.numpy == np.dtype(dtype) and t.shape == (3, 4) and t.data_ptr() == base.ctypes.data
    back = np.from_dlpack(t)
    assert back.ctypes.data == base.ctypes.data and back.dtype == base.dtype
    back[2, 3] = 1
    assert t[2, 3].item() == 1 and base[2, 3] == 1  # one memory, three views
    view = it.from_dlpack(base[:, 1::2])  # strided
    assert view.stride() == (4, 2) and view.numpy().tolist() == base[:, 1::2].tolist()


def test_the_memory_lives_while_either_side_holds_it():
    t = it.tensor(np.arange(1000, dtype=np.float32))
    a = np.from_dlpack(t)
    del t
    gc.collect()
    assert a[999] == 999.0 and dlpack._EXPORTED  # our tensor is kept for numpy's array
    del a
    gc.collect()
    assert not dlpack._EXPORTED  # numpy called our deleter
    n = np.arange(5.0)
    t = it.from_dlpack(n)
    del n
    gc.collect()
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]  # numpy's memory kept for our tensor
    capsule = it.tensor([1.0]).__dlpack__()  # a capsule nobody takes releases the tensor itself
    assert dlpack._EXPORTED
    del capsule
    gc.collect()
    assert not dlpack._EXPORTED


def test_a_capsule_is_read_once_and_foreign_objects_are_refused():
    capsule = np.arange(3.0).__dlpack__()
    it.from_dlpack(capsule)
    with pytest.raises(TypeError, match="read once"):
        it.from_dlpack(capsule)
    with pytest.raises(TypeError, match="__dlpack__"):
        it.from_dlpack([1, 2, 3])
    assert it.tensor([1.0]).__dlpack_device__() == (1, 0)


def test_pytorch_reads_ours_and_we_read_pytorchs_bfloat16_included():
    torch = pytest.importorskip("torch")
    t = it.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    tt = torch.from_dlpack(t)
    tt[1, 2] = -1.0
    assert t[1, 2].item() == -1.0 and tt.data_ptr() == t.data_ptr()
    assert torch.from_dlpack(t.t()).stride() == (1, 3)
    bf = torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16)
    ours = it.from_dlpack(bf)
    assert ours.dtype is it.bfloat16 and ours.float().tolist() == [1.5, -2.25, 3.0]
    assert torch.from_dlpack(ours).dtype == torch.bfloat16
    sliced = torch.arange(12.0).reshape(3, 4)[1:, ::2]
    assert it.from_dlpack(sliced).tolist() == sliced.tolist()


@pytest.mark.cuda
def test_cuda_tensors_go_both_ways_with_pytorch_on_a_gpu():
    torch = pytest.importorskip("torch")
    if not (it.cuda.is_available() and torch.cuda.is_available()):
        pytest.skip("needs a GPU for both infinitrain and PyTorch")
    t = it.tensor([1.0, 2.0, 3.0], device="cuda")
    tt = torch.from_dlpack(t)
    assert tt.device.type == "cuda" and tt.data_ptr() == t.data_ptr() and tt.tolist() == [1.0, 2.0, 3.0]
    back = it.from_dlpack(torch.arange(4.0, device="cuda"))
    assert back.device.type == "cuda" and back.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_read_only_memory_is_copied_not_written(tmp_path):
    """DLPack's read-only flag (a read-only numpy array, a read-only memory map): the tensor is
    a copy, with a warning; the first in-place op on a read-only map was a SIGSEGV."""
    frozen = np.arange(4, dtype=np.float32)
    frozen.flags.writeable = False
    with pytest.warns(UserWarning, match="read-only"):
        t = it.from_dlpack(frozen)
    t.add_(1)
    assert frozen.tolist() == [0, 1, 2, 3] and t.tolist() == [1, 2, 3, 4]
    np.arange(6, dtype=np.float32).tofile(tmp_path / "m.bin")
    with pytest.warns(UserWarning, match="read-only"):
        mapped = it.from_dlpack(np.memmap(tmp_path / "m.bin", dtype=np.float32, mode="r"))
    assert mapped.mul_(2).tolist() == [0, 2, 4, 6, 8, 10]
    writable = np.arange(3, dtype=np.float32)
    it.from_dlpack(writable).add_(1)  # shared, as before
    assert writable.tolist() == [1, 2, 3]
