"""benchmarks/gpu_predict.py: the kernel ceilings its table prints, and its reading of a GPU run's
per-kernel table (PyTorch's profiler format)."""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gpu_predict", ROOT / "benchmarks" / "gpu_predict.py")
gpu_predict = importlib.util.module_from_spec(spec)
sys.modules["gpu_predict"] = gpu_predict  # its dataclass looks itself up there
spec.loader.exec_module(gpu_predict)

def _row(name, cuda_total):  # a row of PyTorch's profiler table with CUDA activity only
    zeros = "0.00%  0.000us  0.00%  0.000us  0.000us"
    return f"{name}  {zeros}  {cuda_total}  1.0%  {cuda_total}  1.000us  12"


HEADER = ("Name  Self CPU %  Self CPU  CPU total %  CPU total  CPU time avg  Self CUDA  Self CUDA %  CUDA total"
          "  CUDA time avg  # of Calls")
TABLE = "\n".join([HEADER, "-" * 60,
                   _row("void (anonymous namespace)::mma_forward<__nv_bfloat16, 64, 64>(...)", "2.100ms"),
                   _row("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "9.500ms"),
                   _row("void (anonymous namespace)::column_chunks<__nv_bfloat16>(int, float*, ...)", "850.000us"),
                   _row("void (anonymous namespace)::mma_backward_dkv<__nv_bfloat16, 64, 64>(...)", "5.000ms"),
                   _row("void (anonymous namespace)::mma_backward_dq<__nv_bfloat16, 64, 64>(...)", "3.000ms")])


def test_the_ceilings_follow_from_flops_and_bytes():
    s = gpu_predict.Shape()
    work = gpu_predict.work(s)
    assert work["attention backward"][0] == 3.5 * work["attention forward"][0]
    params = s.L * (12 * s.C * s.C + 13 * s.C) + s.V * s.C + 1024 * s.C + 2 * s.C
    assert gpu_predict.Shape.preset("gpt2", 16, 1024) == s  # the defaults are GPT-2 124M's preset
    medium = gpu_predict.Shape.preset("gpt2-medium", 16, 1024)
    assert (medium.L, medium.C, medium.H) == (24, 1024, 16)
    assert work["AdamW"][1] == params * 4 * 7  # ~124M float32 parameters, 7 accesses each
    h100, h200 = (gpu_predict.predict(s, gpu_predict.GPUS[g]) for g in ("h100", "h200"))
    assert h100["matrix products (cuBLAS)"] == h200["matrix products (cuBLAS)"]  # the same tensor cores
    assert h100["LayerNorm"] / h200["LayerNorm"] == 4.8 / 3.35  # memory-bound: the bandwidths' ratio
    # a product at 80 % of 989 TFLOP/s: 12.1 TFLOP in ~15 ms
    assert 15.0 < h200["matrix products (cuBLAS)"] < 16.0


def test_a_runs_kernel_table_is_summed_by_family(tmp_path):
    path = tmp_path / "kernels.log"
    path.write_text(TABLE)
    got = gpu_predict.measured_from(str(path))
    assert got["attention forward"] == 2.1 and got["attention backward"] == 8.0
    assert got["matrix products (cuBLAS)"] == 9.5 and got["bias gradients"] == 0.85
    assert got["GELU"] == 0.0
