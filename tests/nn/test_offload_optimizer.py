"""OffloadOptimizer in one process: the state on disk (direct and buffered I/O) gives the same
bits as the optimizer it wraps, for AdamW, Adam and SGD, with parameters split over blocks and
parameters that get no gradient in a step; its state_dict is the wrapped optimizer's, and state
moves between the two; the scratch file is unlinked and its space reserved; a folder that does
not exist, a disk too small, a failing write are clear errors. The multi-process runs (ZeRO 0-3,
DP 2, GPT-2 and LLaMA-3, resume across offload) are in tests/parallel/test_offload.py."""
import os

import numpy as np
import pytest

import infinitrain as it
from infinitrain.optim import SGD, Adam, AdamW, OffloadError, OffloadOptimizer
from helpers import mpirun

SHAPES = [(100, 70), (3000,), (50, 50), (7,)]  # 7000 elements: split over blocks below
SMALL = 0.02  # MB of state per block: 2621 AdamW elements, 5242 of SGD's


def _params(seed=1):
    rng = np.random.default_rng(seed)
    return [it.nn.Parameter(it.from_numpy(rng.standard_normal(s).astype(np.float32))) for s in SHAPES]


def _groups(ps):
    return [{"params": ps[:2], "weight_decay": 0.1}, {"params": ps[2:], "weight_decay": 0.0}]


def _train(opt, ps, steps=3, first=0):
    for step in range(first, first + steps):
        for j, p in enumerate(ps):
            if step == 1 and j == 1:  # no gradient this step: no update, no step counted
                p.grad = None
                continue
            p.grad = it.from_numpy(np.random.default_rng(step * 10 + j).standard_normal(p.shape).astype(np.float32))
        opt.step()
    return [p.detach().numpy().copy() for p in ps]


OPTIMIZERS = [(AdamW, dict(lr=0.01)), (Adam, dict(lr=0.01)), (SGD, dict(lr=0.01, momentum=0.9)),
              (SGD, dict(lr=0.01, momentum=0.9, nesterov=True))]


@pytest.mark.parametrize("direct", [True, False], ids=["direct I/O", "buffered I/O"])
@pytest.mark.parametrize("cls,kw", OPTIMIZERS, ids=["AdamW", "Adam", "SGD", "SGD-nesterov"])
def test_offloaded_steps_give_the_same_bits(tmp_path, cls, kw, direct):
    plain_ps, off_ps = _params(), _params()
    plain = cls(_groups(plain_ps), **kw)
    off = OffloadOptimizer(cls(_groups(off_ps), **kw), "nvme", path=tmp_path, buffer_mb=SMALL, direct=direct)
    assert len(off.blocks) >= 2 and off.store.direct is direct
    for a, b in zip(_train(plain, plain_ps), _train(off, off_ps)):
        np.testing.assert_array_equal(a, b)
    want, got = plain.state_dict(), off.state_dict()
    assert got["param_groups"] == want["param_groups"] and sorted(got["state"]) == sorted(want["state"])
    for i, st in want["state"].items():
        for k, v in st.items():
            g = got["state"][i][k]
            assert (np.array_equal(g.numpy(), v.numpy()) if isinstance(v, it.Tensor) else g == v), (i, k)
    # what a step moves: the whole state read and written, in blocks
    before = off.store.bytes_read, off.store.bytes_written
    _train(off, off_ps, steps=1, first=5)
    padded = sum(b.nbytes if direct else b.numel * 4 * len(off.keys) for b in off.blocks)
    assert (off.store.bytes_read - before[0], off.store.bytes_written - before[1]) == (padded, padded)


def test_state_moves_between_offloaded_and_plain_optimizers(tmp_path):
    """Resume an offloaded run without offload and the other way round: the same bits as a run
    that never stopped."""
    whole_ps = _params()
    whole = _train(AdamW(_groups(whole_ps), lr=0.01), whole_ps, steps=6)
    ps = _params()
    off = OffloadOptimizer(AdamW(_groups(ps), lr=0.01), "nvme", path=tmp_path, buffer_mb=SMALL)
    _train(off, ps, steps=2)
    plain = AdamW(_groups(ps), lr=0.5)  # the loaded hyperparameters win
    plain.load_state_dict(off.state_dict())
    _train(plain, ps, steps=2, first=2)
    back = OffloadOptimizer(AdamW(_groups(ps), lr=0.5), "nvme", path=tmp_path, buffer_mb=SMALL)
    back.load_state_dict(plain.state_dict())
    assert back.param_groups[0]["lr"] == 0.01
    for a, b in zip(whole, _train(back, ps, steps=2, first=4)):
        np.testing.assert_array_equal(a, b)


def test_the_scratch_file_is_unlinked_and_its_space_reserved(tmp_path):
    ps = _params()
    off = OffloadOptimizer(AdamW(_groups(ps), lr=0.01), "nvme", path=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing to clean up, whatever ends the process
    fd = off.store.fd
    link = os.readlink(f"/proc/self/fd/{fd}")
    assert link.startswith(str(tmp_path)) and link.endswith("(deleted)")
    st = os.fstat(fd)
    assert st.st_size >= off.state_bytes and st.st_blocks * 512 >= off.state_bytes  # allocated, not sparse
    assert off.state_bytes == 8 * sum(p.numel() for p in ps) and "exp_avg/exp_avg_sq" in repr(off)
    off.close()


def test_bad_offload_requests_are_clear_errors(tmp_path):
    ps = _params()
    with pytest.raises(ValueError, match="in host memory already; device='nvme'"):
        OffloadOptimizer(AdamW(ps), "cpu")
    with pytest.raises(ValueError, match="needs path="):
        OffloadOptimizer(AdamW(ps), "nvme")
    with pytest.raises(ValueError, match="device must be 'cpu' or 'nvme'"):
        OffloadOptimizer(AdamW(ps), "disk", path=tmp_path)
    with pytest.raises(ValueError, match="keeps no state here"):
        OffloadOptimizer(SGD(ps, lr=0.1), "nvme", path=tmp_path)
    with pytest.raises(OffloadError, match="is not a folder: make it"):
        OffloadOptimizer(AdamW(ps), "nvme", path=tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(OffloadError, match="is not a folder"):
        OffloadOptimizer(AdamW(ps), "nvme", path=tmp_path / "file")
    with pytest.raises(ValueError, match="must be float32"):
        OffloadOptimizer(AdamW([it.nn.Parameter(it.ones(4, dtype=it.bfloat16))]), "nvme", path=tmp_path)


@pytest.mark.slow
def test_a_disk_too_small_is_an_error_when_the_space_is_reserved(tmp_path):
    """A file-size limit stands in for a full disk: posix_fallocate fails when the optimizer is
    made, before any training, and says how much it needed and what to do."""
    code = f"""
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
import infinitrain as it
from infinitrain.optim import AdamW, OffloadError, OffloadOptimizer
try:
    OffloadOptimizer(AdamW([it.nn.Parameter(it.ones(1000, 1000))]), "nvme", path={str(tmp_path)!r})
except OffloadError as e:
    print("refused:", e)
"""
    out = mpirun(1, ["-c", code], timeout=60, check=False)
    assert "refused: offload path" in out.stdout and "cannot reserve 0.01 GB" in out.stdout, out.stdout + out.stderr
    assert "free space there or name a bigger disk" in out.stdout and list(tmp_path.iterdir()) == []


def test_a_failing_write_stops_the_step_with_a_message(tmp_path):
    ps = _params()
    off = OffloadOptimizer(AdamW(_groups(ps), lr=0.01), "nvme", path=tmp_path, buffer_mb=SMALL)
    _train(off, ps, steps=1)
    os.close(off.store.fd)  # the disk goes away under the optimizer
    with pytest.raises(OffloadError, match="(reading|writing) optimizer state .* failed: Bad file descriptor"):
        _train(off, ps, steps=1, first=1)
    off.store.fd = None
