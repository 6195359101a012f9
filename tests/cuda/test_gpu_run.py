"""benchmarks/gpu: the prepared GPU run. summary.py's table from a run's folder in the formats the
real GPU machine writes (figures of the H200 run), the PyTorch LLaMA it times beside infinitrain's
being the same model, and run.sh end to end on the emulated GPU (tiny models; its timings mean
nothing and are not checked, only that every field of the table is there and parses)."""
import importlib.util
import json
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import ENV, run

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "benchmarks" / "gpu"


def _module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


summary = _module(GPU / "summary.py", "gpu_summary")


def _json(path, **fields):
    path.write_text(json.dumps(fields) + "\n")


def _train(out, key, fw, model, B, T, tok_s, ms, mfu, peak_gb, loss):
    _json(out / f"train-{key}-{fw}.json", framework=fw, model=model, B=B, T=T, dtype="bfloat16", tok_s=tok_s, ms=ms,
          mfu=mfu, peak_tflops=989.0, peak_mb=peak_gb * 1024, loss=loss, first_loss=loss + 0.01)


@pytest.fixture
def h200_run(tmp_path):
    """A run's folder as run.sh writes it on the GPU machine, with the first H200 run's figures."""
    out = tmp_path
    (out / "env.log").write_text(
        "gpu NVIDIA H200, 580.95.05, 143771 MiB\n"
        "infinitrain infinitrain 0.1.0; BLAS: scipy-openblas32 0.3.30; SIMD: x86-64-v4 (AVX-512); OpenMP: 16 threads; "
        "CUDA: libinfinitrain_cuda.so, CUDA runtime 13.0, 1 device(s) (NVIDIA H200 (sm_90)); cuBLAS: libcublas.so.13\n"
        "cuda available True\ntorch 2.11.0+cu130 cuda True\n")
    (out / "tests.log").write_text(
        "........................s...s...................................ss.s.....\n"
        "=========================== short test summary info ============================\n"
        "SKIPPED [1] tests/cuda/test_cuda.py:52: pycuda is not installed\n"
        "SKIPPED [2] tests/cuda/test_cuda.py:640: needs 2 GPUs\n"
        "61 passed, 5 skipped in 83.21s (0:01:23)\n")
    (out / "memcheck.log").write_text("step    2/2 | train loss 10.820491 | lr 1.00e-04\n"
                                      "========= ERROR SUMMARY: 0 errors\n")
    _train(out, "gpt2", "infinitrain", "gpt2", 16, 1024, 16363.0, 1001.3, 0.0131, 8.9, 10.994)
    _train(out, "gpt2", "torch-eager", "gpt2", 16, 1024, 212263.0, 77.2, 0.172, 14.9, 10.987)
    _train(out, "gpt2", "torch-compiled", "gpt2", 16, 1024, 474045.0, 34.6, 0.385, 10.2, 10.987)
    _train(out, "llama", "infinitrain", "llama3.2-1b", 4, 512, 7818.0, 262.0, 0.074, 23.4, 12.089)
    kernels = [("void attention_fwd<__nv_bfloat16, 64>(__nv_bfloat16 const*, float*, int)", 12, 345.0),
               ("void attention_dkv<__nv_bfloat16, 64>(__nv_bfloat16 const*, float*, int)", 12, 329.0),
               ("void attention_dq<__nv_bfloat16, 64>(__nv_bfloat16 const*, float*, int)", 12, 250.0),
               ("void copy_strided_kernel<float>(float const*, float*, long)", 144, 19.8),
               ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
                "_kernel__5x_cublas", 96, 9.1),
               ("void embedding_bwd<float>(float const*, int const*, float*, int, int)", 1, 8.6),
               ("void cast_kernel<float, __nv_bfloat16>(float const*, __nv_bfloat16*, long)", 293, 6.8)]
    kernels += [(f"void small_kernel_{i}(float*)", 10, 2.0 - i / 10) for i in range(8)]
    _json(out / "kernels-gpt2.json", framework="infinitrain", model="gpt2", B=16, T=1024, dtype="bfloat16",
          step_ms=1001.2, gpu_ms=sum(k[2] for k in kernels),
          kernels=[dict(name=n, calls=c, ms=ms) for n, c, ms in kernels])
    (out / "attention.log").write_text(
        "shape                        implementation             fwd ms  TFLOP/s   bwd ms  TFLOP/s\n"
        "B16 H12/12 T1024 d64         infinitrain (flash)         1.210     21.3    3.904     16.5\n"
        "B16 H12/12 T1024 d64         torch cudnn_attention       0.083    310.4    0.225    286.3\n"
        "  (PyTorch FLASH_ATTENTION: No available kernel. Aborting execution.)\n"
        "B4 H32/8 T2048 d128          infinitrain (flash)         2.500     55.0    7.100     48.4\n")
    (out / "steps.txt").write_text("env 0 4\ntests 0 85\nmemcheck 0 41\ntrain-gpt2-infinitrain 0 38\n"
                                   "train-gpt2-torch-eager 0 17\ntrain-gpt2-torch-compiled 0 71\nkernels-gpt2 0 22\n"
                                   "attention 0 12\ntrain-llama-infinitrain 0 45\ntrain-llama-torch-eager 1 20\n"
                                   "train-llama-torch-compiled 124 150\n")
    _json(out / "train-llama-torch-eager.json", framework="torch-eager", model="llama3.2-1b", B=4, T=512,
          error="OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB")
    return out


def _table(text, header):
    """The rows of the markdown table whose header row starts with `header`, as lists of cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def test_the_summary_of_a_gpu_run_has_every_figure(h200_run):
    text = summary.summary(h200_run)
    assert text.startswith("## GPU run: NVIDIA H200, 580.95.05, 143771 MiB; infinitrain's libinfinitrain_cuda.so, "
                           "CUDA runtime 13.0, 1 device(s) (NVIDIA H200 (sm_90)); torch 2.11.0+cu130 cuda True"), text
    checks = dict(_table(text, "check"))
    assert checks["GPU tests (tests/cuda)"] == "61 passed, 0 failed, 5 skipped"
    assert checks["memcheck (GPT-2 tiny, bf16, 2 steps)"] == "0 errors"
    rows = {(r[0], r[2]): r for r in _table(text, "model")}
    it = rows[("GPT-2 gpt2", "infinitrain")]
    assert it[1] == "16 × 1024" and it[3:] == ["16,363", "1001.3", "1.3 %", "8.9 GiB", "10.994", "0.08x"]
    assert rows[("GPT-2 gpt2", "PyTorch eager")][3:6] == ["212,263", "77.2", "17.2 %"]
    assert rows[("GPT-2 gpt2", "torch.compile")][3] == "474,045" and rows[("GPT-2 gpt2", "torch.compile")][8] == "2.23x"
    assert rows[("LLaMA-3 llama3.2-1b", "infinitrain")][1:7] == ["4 × 512", "infinitrain", "7,818", "262.0", "7.4 %",
                                                                 "23.4 GiB"]
    assert rows[("LLaMA-3 llama3.2-1b", "PyTorch eager")][3].startswith("OutOfMemoryError: CUDA out of memory")
    assert rows[("LLaMA-3", "torch.compile")][3] == "timed out (150 s)"  # no file: the step's record says why
    attention = _table(text, "shape")
    assert len(attention) == 3 and attention[1] == ["B16 H12/12 T1024 d64", "torch cudnn_attention", "0.083", "310.4",
                                                    "0.225", "286.3"]
    kernels = _table(text, "#")
    assert len(kernels) == 10 and kernels[0] == ["1", "`attention_fwd<__nv_bfloat16, 64>`", "12", "345.00", "35.2 %"]
    assert kernels[4][1].startswith("`sm90_xmma_gemm") and kernels[4][1].endswith("…`") and len(kernels[4][1]) == 92
    assert "of kernels in a 1001.2 ms step" in text
    assert "train-llama-torch-compiled 124 150; 505 s in all." in text


def test_the_summary_says_what_failed_and_what_did_not_run(h200_run):
    (h200_run / "tests.log").write_text("FAILED tests/cuda/test_cuda.py::test_attention_on_the_gpu[bfloat16] - x\n"
                                        "1 failed, 60 passed, 5 skipped in 90.00s\n")
    (h200_run / "memcheck.log").write_text("========= ERROR SUMMARY: 3 errors\n")
    for name in ("attention.log", "kernels-gpt2.json"):
        (h200_run / name).unlink()
    with open(h200_run / "steps.txt", "a") as f:
        f.write("kernels-gpt2 124 60\n")
    text = summary.summary(h200_run)
    checks = dict(_table(text, "check"))
    assert checks["GPU tests (tests/cuda)"] == "60 passed, 1 failed, 5 skipped — test_attention_on_the_gpu[bfloat16]"
    assert checks["memcheck (GPT-2 tiny, bf16, 2 steps)"] == "3 errors"
    assert "### Attention: no result" in text and "### Top 10 kernels by GPU time: timed out (60 s)" in text
    empty = Path(h200_run / "empty")
    empty.mkdir()
    assert dict(_table(summary.summary(empty), "check"))["GPU tests (tests/cuda)"] == "not run"


@pytest.mark.slow  # (a few seconds: PyTorch's first LLaMA)
def test_the_pytorch_llama_timed_beside_infinitrain_is_the_same_model():
    """benchmarks/gpu/torch_llama.py with infinitrain's weights: the loss and gradients of
    infinitrain's LLaMA-3 (GQA, rotary pairs, SwiGLU), so the GPU figures compare one model."""
    torch = pytest.importorskip("torch")
    import infinitrain as it
    from infinitrain.models import llama3
    sys.path.insert(0, str(GPU))
    try:
        from torch_llama import TorchLLaMA3
    finally:
        sys.path.remove(str(GPU))
    model = llama3("tiny")
    ours = TorchLLaMA3(model.config)
    ours.load_state_dict({k: torch.from_numpy(np.array(v.numpy())) for k, v in model.state_dict().items()})
    batch = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 17))
    _, loss = model(it.from_numpy(batch[:, :-1].copy()), it.from_numpy(batch[:, 1:].copy()))
    loss.backward()
    theirs = ours(torch.from_numpy(batch[:, :-1]), torch.from_numpy(batch[:, 1:]))
    theirs.backward()
    np.testing.assert_allclose(theirs.item(), loss.item(), rtol=1e-5)
    grads = dict(ours.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(grads[name].grad.numpy(), p.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_train_gpu_names_the_preset_it_cannot_choose():
    train_gpu = _module(GPU / "train_gpu.py", "gpu_train")
    assert train_gpu.resolve("llama3.2-1b")[:2] == ("llama3", "llama3.2-1b")
    assert train_gpu.resolve("gpt2:tiny")[:2] == ("gpt2", "tiny")
    with pytest.raises(ValueError, match="both GPT-2 and LLaMA-3 have it: write gpt2:tiny or llama3:tiny"):
        train_gpu.resolve("tiny")
    with pytest.raises(ValueError, match="'gpt3': no such preset"):
        train_gpu.resolve("gpt3")


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to build the emulated GPU")
def test_the_gpu_run_on_the_emulated_gpu_prints_its_table(tmp_path, tmp_path_factory):
    """run.sh from a pack whose site adds nothing (the checkout's infinitrain, on the emulated
    GPU), tiny models at 1 x 8, one step each: the infinitrain rows with figures, PyTorch's (a CPU
    build here) saying "no CUDA" instead of failing, the kernel table saying why it is absent."""
    emulator = _module(Path(__file__).parent / "cuda_emulator" / "build.py", "cuda_emulator_build")
    # the library test_cuda_emulated.py built in this session, when there is one (only relinked)
    built = sorted(tmp_path_factory.getbasetemp().glob("emulated-cuda*/libinfinitrain_cuda.so"))
    library = emulator.build(built[0].parent if built else tmp_path_factory.mktemp("emulated-cuda"))
    pack, out = tmp_path / "pack", tmp_path / "out"
    (pack / "site").mkdir(parents=True)
    (pack / "data").mkdir()
    (pack / "proj").symlink_to(ROOT)
    env = dict(ENV, INFINITRAIN_CUDA_LIBRARY=str(library), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               GPU_SKIP="tests,memcheck,attention", GPU_GPT2_MODEL="gpt2:tiny", GPU_LLAMA_MODEL="llama3:tiny",
               GPU_B="1", GPU_T="8", GPU_LLAMA_B="1", GPU_LLAMA_T="8", GPU_STEPS="1", GPU_WARMUP="0",
               GPU_LLAMA_STEPS="1")
    done = run(["bash", GPU / "run.sh", pack, out], timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = (out / "summary.md").read_text()
    assert text in done.stdout
    assert "emulated GPU" in text.splitlines()[0]
    checks = dict(_table(text, "check"))
    assert checks["GPU tests (tests/cuda)"] == "not run" and checks["memcheck (GPT-2 tiny, bf16, 2 steps)"] == "not run"
    rows = {(r[0], r[2]): r for r in _table(text, "model")}
    assert set(rows) == {(m, fw) for m in ("GPT-2 tiny", "LLaMA-3 tiny")
                         for fw in ("infinitrain", "PyTorch eager", "torch.compile")}
    for model in ("GPT-2 tiny", "LLaMA-3 tiny"):
        r = rows[(model, "infinitrain")]
        assert r[1] == "1 × 8"
        tok_s, ms, mfu, peak = float(r[3].replace(",", "")), float(r[4]), float(r[5][:-2]), float(r[6][:-4])
        assert min(tok_s, ms, peak) > 0 and mfu >= 0 and r[5].endswith(" %") and r[6].endswith(" MiB"), r
        assert 10 < float(r[7]) < 11.5  # ln(50257) = 10.8: a random model's first loss
        for fw in ("PyTorch eager", "torch.compile"):  # PyTorch's CPU build here, or none
            assert rows[(model, fw)][3] == "no CUDA", rows[(model, fw)]
    assert "### Top 10 kernels by GPU time: no CUDA" in text
    assert re.search(r"Steps \(status, seconds\): env ok \d+, train-gpt2-infinitrain ok \d+, "
                     r"train-llama-infinitrain ok \d+; \d+ s in all\.", text), text
