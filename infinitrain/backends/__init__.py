"""torch.backends: the switches PyTorch programs flip to tune their backends
(backends.cuda.matmul.allow_tf32, backends.cudnn.benchmark / deterministic / allow_tf32 / enabled,
backends.mps.is_available(), backends.cpu.get_cpu_capability()), with float32 matmul precision.

The settings are kept and read back as PyTorch's are, but they change no result here: float32
matmuls always run at full float32 precision (TF32 and reduced-precision reductions are
permissions, which PyTorch too ignores on a GPU without them), infinitrain has no cuDNN to
autotune, and no separate deterministic kernels to switch to."""
from __future__ import annotations

from . import cuda, cudnn  # noqa: F401  (torch.backends.cuda, torch.backends.cudnn: modules, as there)
from .precision import get_float32_matmul_precision, set_float32_matmul_precision  # noqa: F401

class _Mps:
    @staticmethod
    def is_available() -> bool:
        return False

    @staticmethod
    def is_built() -> bool:
        return False


class _Cpu:
    @staticmethod
    def get_cpu_capability() -> str:
        """'AVX2' where the library's kernels were built for it, else 'DEFAULT'."""
        from ..runtime import build_info
        return "AVX2" if "AVX2" in build_info() else "DEFAULT"


mps = _Mps()
cpu = _Cpu()
