"""torch.backends.cuda: `matmul.allow_tf32` is the float32 matmul precision seen as a flag (True
is 'high', False 'highest'), as in PyTorch; kept and read back, changing no result here."""
from __future__ import annotations

from .precision import get_float32_matmul_precision, set_float32_matmul_precision


class _Matmul:
    allow_fp16_reduced_precision_reduction = True
    allow_bf16_reduced_precision_reduction = True

    @property
    def allow_tf32(self) -> bool:
        return get_float32_matmul_precision() != "highest"

    @allow_tf32.setter
    def allow_tf32(self, value: bool) -> None:
        set_float32_matmul_precision("high" if value else "highest")


matmul = _Matmul()
