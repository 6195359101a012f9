"""torch.linalg's norms: norm, vector_norm, matrix_norm (the decompositions are not here)."""
from __future__ import annotations

from .ops.norms import matrix_norm, vector_norm
from .tensor import Tensor

__all__ = ["norm", "vector_norm", "matrix_norm"]


def norm(A: Tensor, ord=None, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:  # noqa: A002
    """A vector norm over one dim (or over everything, when ord and dim are None), a matrix norm
    over two dims (or of a 2-D A when ord is given), as torch.linalg.norm."""
    if isinstance(dim, int):
        dim = (dim,)
    if dim is None:
        if ord is None:
            return vector_norm(A, 2, None, keepdim, dtype=dtype)
        if A.ndim not in (1, 2):
            raise ValueError(f"linalg.norm: with ord and no dim, A must be 1-D or 2-D, got {A.ndim}-D")
        dim = tuple(range(A.ndim))
    if len(dim) == 1:
        return vector_norm(A, 2 if ord is None else ord, dim, keepdim, dtype=dtype)
    if len(dim) == 2:
        return matrix_norm(A, "fro" if ord is None else ord, dim, keepdim, dtype=dtype)
    raise ValueError(f"linalg.norm: dim must have 1 or 2 entries, got {dim}")
