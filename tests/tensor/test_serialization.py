"""infinitrain.save / infinitrain.load (our safe format, and PyTorch's zip files read without
PyTorch), their refusals, and tensors, Parameters and Modules pickled in memory."""
import copy
import io
import math
import pickle
import zipfile
from collections import OrderedDict

import numpy as np
import pytest

import infinitrain as it
from infinitrain.io import DataFormatError


def _torch():
    return pytest.importorskip("torch")


def _saved(obj, **kwargs):
    buf = io.BytesIO()
    it.save(obj, buf)
    buf.seek(0)
    return it.load(buf, **kwargs)


def _torch_bytes(obj, **kwargs) -> bytes:
    buf = io.BytesIO()
    _torch().save(obj, buf, **kwargs)
    return buf.getvalue()


def _same(a, b):
    """Equal dtype (by name), shape and values: a torch or infinitrain tensor against ours."""
    def values(t):
        t = t.detach()
        return np.asarray(t.float().tolist() if str(t.dtype).endswith("bfloat16") else t.tolist())
    assert str(a.dtype).split(".")[-1] == b.dtype.name and tuple(a.shape) == tuple(b.shape)
    np.testing.assert_array_equal(values(a), values(b))


# ---- our format ----------------------------------------------------------------------------

def test_round_trip_keeps_values_types_views_and_sharing(tmp_path):
    base = it.arange(12.0).reshape(3, 4)
    obj = {"base": base, "t": base.t(), "row": base[1], "cols": base[:, 1::2], "b16": it.randn(2, 3).to(it.bfloat16),
           "i64": it.tensor([1, -2, 3]), "empty": it.zeros(0, 2), "p": it.nn.Parameter(it.randn(2)),
           "rg": it.randn(2, requires_grad=True), 7: [1, 2.5, float("nan"), -math.inf, None, True, "s"],
           (1, "k"): ({3, 4}, 1 + 2j, b"\x00\xff"), "od": OrderedDict(a=1), "dt": it.bfloat16, "dev": it.device("cpu")}
    for back in (_saved(obj), None):
        if back is None:  # and through a path
            it.save(obj, tmp_path / "x.pt")
            back = it.load(tmp_path / "x.pt")
        for k in ("base", "t", "row", "cols", "b16", "i64", "empty", "p", "rg"):
            _same(obj[k], back[k])
            assert back[k].stride() == obj[k].stride()
        assert type(back["p"]) is it.nn.Parameter and back["p"].requires_grad and back["rg"].requires_grad
        assert not back["base"].requires_grad
        assert back[7][:2] == [1, 2.5] and math.isnan(back[7][2]) and back[7][3:] == [-math.inf, None, True, "s"]
        assert type(back[7][0]) is int and back[(1, "k")] == ({3, 4}, 1 + 2j, b"\x00\xff")
        assert type(back["od"]) is OrderedDict and back["dt"] is it.bfloat16 and back["dev"] == it.device("cpu")
        back["base"][1, 1] = -1.0  # the views still share one storage
        assert back["t"][1, 1].item() == -1.0 and back["row"][1].item() == -1.0 and back["cols"][1, 0].item() == -1.0


def test_save_refuses_what_it_cannot_store_naming_where():
    with pytest.raises(TypeError, match=r"obj\['m'\] \(of type infinitrain.nn.modules.Linear\).*state_dict"):
        it.save({"m": it.nn.Linear(2, 2)}, io.BytesIO())
    with pytest.raises(TypeError, match=r"obj\['a'\]\[1\] \(of type builtins.function\)"):
        it.save({"a": [1, lambda: 0]}, io.BytesIO())
    with pytest.raises(TypeError, match="numpy.float64"):
        it.save([np.float64(1.0)], io.BytesIO())
    with pytest.raises(FileNotFoundError, match="does not exist"):
        it.save({}, "/nonexistent-folder/x.pt")
    loop = []
    loop.append(loop)
    with pytest.raises(ValueError, match="contains itself"):
        it.save(loop, io.BytesIO())


def test_load_refuses_a_damaged_file_of_ours():
    buf = io.BytesIO()
    it.save({"w": it.randn(100)}, buf)
    data = buf.getvalue()
    with pytest.raises(DataFormatError, match="damaged or truncated"):
        it.load(io.BytesIO(data[: len(data) - 50]))


# ---- PyTorch's files -----------------------------------------------------------------------

def test_reads_torch_tensors_views_dtypes_and_shared_storage():
    torch = _torch()
    big = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    obj = {"big": big, "view": big[:, 1:5:2], "t": big.t(), "row": big[2], "b16": torch.randn(3, 2).bfloat16().t(),
           "i64": torch.arange(5), "half": torch.ones(2, dtype=torch.float16), "mask": torch.tensor([True, False]),
           "p": torch.nn.Parameter(torch.randn(2)), "rg": torch.randn(2, requires_grad=True), "s": torch.tensor(3.5),
           "cfg": {"betas": (0.9, 0.95), "none": None, "dt": torch.bfloat16, "dev": torch.device("cpu"),
                   "size": torch.Size([2, 3]), "set": {1, 2}, "bytes": b"ab", "inf": float("inf")}}
    back = it.load(io.BytesIO(_torch_bytes(obj)))
    for k in ("big", "view", "t", "row", "b16", "i64", "half", "mask", "p", "rg", "s"):
        _same(obj[k], back[k])
        assert back[k].stride() == obj[k].stride() and back[k].requires_grad == obj[k].requires_grad
    assert type(back["p"]) is it.nn.Parameter
    assert back["cfg"] == {"betas": (0.9, 0.95), "none": None, "dt": it.bfloat16, "dev": it.device("cpu"),
                           "size": (2, 3), "set": {1, 2}, "bytes": b"ab", "inf": math.inf}
    back["big"][2, 3] = -1.0  # one storage in the file, one here
    assert back["view"][2, 1].item() == -1.0 and back["t"][3, 2].item() == -1.0 and back["row"][3].item() == -1.0


def test_torch_state_dict_loads_into_a_module_with_the_same_outputs():
    torch = _torch()
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3))
    ours = it.nn.Sequential(it.nn.Linear(4, 8), it.nn.GELU(), it.nn.LayerNorm(8), it.nn.Linear(8, 3))
    sd = it.load(io.BytesIO(_torch_bytes(ref.state_dict())))
    assert type(sd) is OrderedDict and list(sd) == list(ref.state_dict())
    ours.load_state_dict(sd)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(ours(it.tensor(x)).detach().numpy(), ref(torch.tensor(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-5)


def _tiny_gpt(nn):
    class TinyGPT(nn.Module):  # nanoGPT's names and its tied embedding / head
        def __init__(self):
            super().__init__()
            self.wte, self.ln_f = nn.Embedding(16, 8), nn.LayerNorm(8)
            self.lm_head = nn.Linear(8, 16, bias=False)
            self.wte.weight = self.lm_head.weight

        def forward(self, idx):
            return self.lm_head(self.ln_f(self.wte(idx)))
    return TinyGPT()


def _nanogpt_checkpoint(torch, ref, optimizer_state) -> bytes:
    """A checkpoint as nanoGPT's train.py writes it (ckpt.pt), by the real torch.save."""
    return _torch_bytes({"model": ref.state_dict(), "optimizer": optimizer_state, "iter_num": 5,
                         "model_args": dict(n_layer=1, n_embd=8, vocab_size=16, bias=False, dropout=0.0),
                         "best_val_loss": torch.tensor(2.5),
                         "config": {"batch_size": 12, "compile": True, "dtype": "bfloat16"}})


def test_nanogpt_checkpoint_loads_model_and_optimizer():
    torch = _torch()
    torch.manual_seed(0)
    ref, ours, idx = _tiny_gpt(torch.nn), _tiny_gpt(it.nn), [[1, 2, 3], [4, 5, 6]]
    # torch.optim.AdamW's state_dict after one step, built by hand (torch.optim takes seconds to import)
    params = list(ref.parameters())
    state = {i: {"step": torch.tensor(1.0), "exp_avg": torch.randn(p.shape), "exp_avg_sq": torch.rand(p.shape)}
             for i, p in enumerate(params)}
    groups = [{"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "amsgrad": False,
               "maximize": False, "foreach": None, "capturable": False, "differentiable": False, "fused": None,
               "decoupled_weight_decay": True, "params": list(range(len(params)))}]
    back = it.load(io.BytesIO(_nanogpt_checkpoint(torch, ref, {"state": state, "param_groups": groups})),
                   map_location="cpu")
    assert back["iter_num"] == 5 and back["best_val_loss"].item() == 2.5 and back["config"]["compile"] is True
    assert back["model"]["wte.weight"].data_ptr() == back["model"]["lm_head.weight"].data_ptr()
    ours.load_state_dict(back["model"])
    np.testing.assert_allclose(ours(it.tensor(idx)).detach().numpy(), ref(torch.tensor(idx)).detach().numpy(),
                               rtol=1e-5, atol=1e-5)
    opt = it.optim.AdamW(ours.parameters(), lr=1e-3)
    opt.load_state_dict(back["optimizer"])
    assert opt.param_groups[0]["lr"] == 1e-2 and opt.param_groups[0]["betas"] == (0.9, 0.95)
    for i, p in enumerate(ours.parameters()):
        assert opt.state[p]["step"] == 1
        np.testing.assert_array_equal(opt.state[p]["exp_avg"].numpy(), state[i]["exp_avg"].numpy())


@pytest.mark.slow
def test_nanogpt_checkpoint_resumes_as_torch_does():
    torch = _torch()
    torch.manual_seed(0)
    ref, ours, idx = _tiny_gpt(torch.nn), _tiny_gpt(it.nn), [[1, 2, 3], [4, 5, 6]]
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    (ref(torch.tensor(idx)) ** 2).mean().backward()
    ref_opt.step()
    back = it.load(io.BytesIO(_nanogpt_checkpoint(torch, ref, ref_opt.state_dict())))
    ours.load_state_dict(back["model"])
    ours_opt = it.optim.AdamW(ours.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    ours_opt.load_state_dict(back["optimizer"])
    for model, opt, lib in ((ref, ref_opt, torch), (ours, ours_opt, it)):  # one more step on each
        opt.zero_grad()
        (model(lib.tensor(idx)) ** 2).mean().backward()
        opt.step()
    for (name, a), (_, b) in zip(ref.named_parameters(), ours.named_parameters()):
        np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_mmap_maps_the_files_copy_on_write(tmp_path):
    torch = _torch()
    w = torch.arange(12.0).reshape(3, 4)
    torch.save({"w": w, "t": w.t(), "b16": w.bfloat16(), "i": torch.arange(3)}, tmp_path / "theirs.pt")
    it.save({"w": it.tensor(w.numpy()), "b16": it.tensor(w.numpy()).to(it.bfloat16), "e": it.zeros(0)},
            tmp_path / "ours.pt")
    for path in ("theirs.pt", "ours.pt"):
        before = (tmp_path / path).read_bytes()
        back = it.load(tmp_path / path, mmap=True)
        _same(w, back["w"])
        _same(w.bfloat16(), back["b16"])
        back["w"][0, 0] = -5.0  # stays in this process
        assert back["w"][0, 0].item() == -5.0 and (tmp_path / path).read_bytes() == before
    assert back["e"].shape == (0,)
    with pytest.raises(ValueError, match="mmap=True needs f to be a file's path"):
        it.load(io.BytesIO(before), mmap=True)


def test_map_location_forms():
    torch = _torch()
    data = _torch_bytes({"w": torch.arange(4.0)})
    for where in (None, "cpu", it.device("cpu"), {"cpu": "cpu"}, lambda storage, location: storage):
        assert it.load(io.BytesIO(data), map_location=where)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(TypeError, match="map_location must be"):
        it.load(io.BytesIO(data), map_location=3)
    with pytest.raises(ValueError, match="not a device infinitrain has"):
        it.load(io.BytesIO(data), map_location="mps")
    if not it.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA device; pass map_location='cpu'"):
            it.load(io.BytesIO(data), map_location={"cpu": "cuda:0"})


def _rewritten(data: bytes, change) -> bytes:
    """A copy of torch.save's zip with each entry's bytes passed through change(name, bytes)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for name in src.namelist():
            dst.writestr(name, change(name, src.read(name)))
    return out.getvalue()


def test_reads_a_gpu_checkpoint_onto_the_cpu_and_a_big_endian_one(tmp_path):
    torch = _torch()
    w = torch.arange(6.0).reshape(2, 3)
    on_gpu = _rewritten(_torch_bytes({"w": w}), lambda name, b: b.replace(b"X\x03\x00\x00\x00cpu",
                                                                          b"X\x06\x00\x00\x00cuda:0"))
    (tmp_path / "ckpt.pt").write_bytes(on_gpu)
    for where in ("cpu", it.device("cpu"), {"cuda:0": "cpu"}):
        _same(w, it.load(tmp_path / "ckpt.pt", map_location=where)["w"])
    if not it.cuda.is_available():
        with pytest.raises(RuntimeError, match="saved on cuda:0.*no CUDA device; pass map_location='cpu'"):
            it.load(tmp_path / "ckpt.pt")
    big = _rewritten(_torch_bytes({"w": w}), lambda name, b: b"big" if name.endswith("byteorder") else
                     np.frombuffer(b, np.float32).byteswap().tobytes() if "/data/" in name else b)
    _same(w, it.load(io.BytesIO(big))["w"])


def test_refuses_a_pickle_that_names_other_code(tmp_path):
    torch = _torch()
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            import os
            return (os.system, (f"touch {marker}",))

    crafted = _rewritten(_torch_bytes({"w": torch.ones(1)}), lambda name, b: pickle.dumps({"x": Evil()}, protocol=2)
                         if name.endswith("data.pkl") else b)
    with pytest.raises(pickle.UnpicklingError, match=r"needs (posix|os)\.system to load.*refuses"):
        it.load(io.BytesIO(crafted))
    assert not marker.exists()


def test_refuses_setting_a_tensors_state_from_the_file():
    torch = _torch()
    # BUILD the tensor with a state (its offset far outside its memory), just before STOP
    crafted = _rewritten(_torch_bytes(torch.ones(2)), lambda name, b: b[:-1] + b"}(X\x07\x00\x00\x00_offsetJ\x00\x00"
                         b"\x00\x10ub." if name.endswith("data.pkl") else b)
    with pytest.raises(pickle.UnpicklingError, match="sets the state of a Tensor"):
        it.load(io.BytesIO(crafted))


def test_refuses_truncated_foreign_and_legacy_files():
    torch = _torch()
    data = _torch_bytes({"w": torch.ones(1000)})
    with pytest.raises(DataFormatError, match="truncated or damaged"):
        it.load(io.BytesIO(data[: len(data) // 2]))
    with pytest.raises(DataFormatError, match="not a checkpoint"):
        it.load(io.BytesIO(bytes(range(7, 200))))
    with pytest.raises(DataFormatError, match="is empty"):
        it.load(io.BytesIO(b""))
    with pytest.raises(DataFormatError, match="legacy format.*re-save"):
        it.load(io.BytesIO(_torch_bytes({"w": torch.ones(2)}, _use_new_zipfile_serialization=False)))
    with pytest.raises(DataFormatError, match="bare pickle"):
        it.load(io.BytesIO(pickle.dumps({"a": 1})))


def test_refuses_a_tensor_past_its_storage():
    torch = _torch()
    data = _torch_bytes(torch.arange(8.0))
    short = _rewritten(data, lambda name, b: b[:16] if name.endswith("data/0") else b)  # 4 of its 8 elements
    with pytest.raises(DataFormatError, match="holds 16 bytes"):
        it.load(io.BytesIO(short))
    shifted = _rewritten(data, lambda name, b: b.replace(b"QK\x00", b"QK\x05") if name.endswith("data.pkl") else b)
    with pytest.raises(DataFormatError, match="reaches past its storage of 8 elements"):
        it.load(io.BytesIO(shifted))


# ---- pickling in memory --------------------------------------------------------------------

def test_tensors_and_parameters_pickle_and_deepcopy():
    base = it.arange(6.0).reshape(2, 3)
    views = pickle.loads(pickle.dumps([base, base[:, 1], it.ones(2, dtype=it.bfloat16), it.tensor([1, 2])]))
    _same(base, views[0])
    views[0][1, 1] = 100.0  # one storage in, one storage out
    assert views[1].tolist() == [1.0, 100.0]
    assert views[2].dtype is it.bfloat16 and views[3].dtype is it.int64
    p = it.nn.Parameter(it.randn(3))
    p.grad = it.ones(3)
    for q in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p)):
        assert type(q) is it.nn.Parameter and q.requires_grad and q.tolist() == p.tolist()
        assert q.data_ptr() != p.data_ptr()
    assert pickle.loads(pickle.dumps(p)).grad is None  # as PyTorch: .grad is not pickled
    x = it.randn(2, requires_grad=True)
    y = pickle.loads(pickle.dumps(x * 2))  # as PyTorch: a non-leaf comes back a leaf that requires grad
    assert y.is_leaf and y.requires_grad


def test_modules_pickle_and_deepcopy_with_equal_outputs():
    model = it.nn.Sequential(it.nn.Linear(3, 4), it.nn.GELU(), it.nn.LayerNorm(4), it.nn.Linear(4, 2))
    x = it.randn(5, 3)
    for other in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        np.testing.assert_array_equal(other(x).detach().numpy(), model(x).detach().numpy())
        assert all(type(p) is it.nn.Parameter for p in other.parameters())
        assert other[0].weight.data_ptr() != model[0].weight.data_ptr()


def test_a_shape_saves_and_loads_as_a_size_in_both_formats(tmp_path):
    """Shapes are infinitrain.Size: save refused them, and a torch.Size in a PyTorch file came back a tuple."""
    it.save({"shape": it.ones(2, 3).shape}, tmp_path / "ours")
    got = it.load(tmp_path / "ours")["shape"]
    assert type(got) is it.Size and got == (2, 3)
    torch = pytest.importorskip("torch")
    torch.save({"shape": torch.ones(4, 5).shape}, tmp_path / "theirs.pt")
    got = it.load(tmp_path / "theirs.pt")["shape"]
    assert type(got) is it.Size and got == (4, 5)
