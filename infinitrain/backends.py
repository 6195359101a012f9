"""torch.backends: the switches PyTorch programs flip to tune their backends
(backends.cuda.matmul.allow_tf32, backends.cudnn.benchmark / deterministic / allow_tf32 / enabled,
backends.mps.is_available(), backends.cpu.get_cpu_capability()), with float32 matmul precision.

The settings are kept and read back as PyTorch's are, but they change no result here: float32
matmuls always run at full float32 precision (TF32 and reduced-precision reductions are
permissions, which PyTorch too ignores on a GPU without them), infinitrain has no cuDNN to
autotune, and no separate deterministic kernels to switch to."""
from __future__ import annotations

import warnings

_PRECISIONS = ("highest", "high", "medium")
_matmul_precision = ["highest"]  # one mutable cell shared by the two ways of setting it


def set_float32_matmul_precision(precision: str) -> None:
    """torch.set_float32_matmul_precision: 'highest', 'high' or 'medium'; anything else is
    ignored with a warning, as PyTorch does."""
    if precision not in _PRECISIONS:
        warnings.warn(f"{precision!r} is not one of 'highest', 'high' or 'medium'; "
                      "set_float32_matmul_precision() had no effect", UserWarning, stacklevel=2)
        return
    _matmul_precision[0] = precision


def get_float32_matmul_precision() -> str:
    return _matmul_precision[0]


class _Matmul:
    """backends.cuda.matmul: allow_tf32 is the float32 matmul precision seen as a flag
    (True is 'high', False 'highest'), as in PyTorch."""

    allow_fp16_reduced_precision_reduction = True
    allow_bf16_reduced_precision_reduction = True

    @property
    def allow_tf32(self) -> bool:
        return _matmul_precision[0] != "highest"

    @allow_tf32.setter
    def allow_tf32(self, value: bool) -> None:
        _matmul_precision[0] = "high" if value else "highest"


class _Cuda:
    matmul = _Matmul()


class _Cudnn:
    """backends.cudnn: infinitrain calls no cuDNN, so is_available() is False; the flags are
    accepted and kept for programs that set them."""

    enabled = True
    benchmark = False
    deterministic = False
    allow_tf32 = True

    @staticmethod
    def is_available() -> bool:
        return False

    @staticmethod
    def version():
        return None


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
        from .runtime import build_info
        return "AVX2" if "AVX2" in build_info() else "DEFAULT"


cuda = _Cuda()
cudnn = _Cudnn()
mps = _Mps()
cpu = _Cpu()
