"""Model FLOPs utilisation for the log line: the FLOPs a step of the model needs (llm.c's count:
6 per parameter per token for the matrix products forward and backward, plus 6 L C T for
attention, causal attention doing half of the full 12 L C T) against the peak the job's ranks
can reach, given or measured."""
from __future__ import annotations

import time

import numpy as np

import infinitrain as it


def flops_per_token(num_parameters: int, n_layer: int, n_embd: int, seq_len: int) -> int:
    return 6 * num_parameters + 6 * n_layer * n_embd * seq_len


def measure_peak_flops(dtype: str, group=None, device="cpu", size: int | None = None,
                       repeats: int = 5) -> float:
    """FLOP/s this rank's matrix products reach (size^3 products in `dtype`, the best of a few;
    1024 on a CPU, 8192 on a GPU, which a smaller product leaves idle), measured with every
    rank of `group` multiplying at once, so that ranks sharing cores see what they will get
    while training."""
    device = it.device(device)
    size = size or (8192 if device.type == "cuda" else 1024)
    rng = np.random.default_rng(0)
    a, b = (it.from_numpy(rng.standard_normal((size, size), dtype=np.float32)).to(dtype=dtype, device=device)
            for _ in range(2))

    def finish():  # a GPU's product is queued, not done, when the call returns
        if device.type == "cuda":
            it.cuda.synchronize(device)

    a @ b  # warm up (threads, caches, cuBLAS's choice of kernel)
    finish()
    if group is not None:
        group.barrier()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        finish()
        best = min(best, time.perf_counter() - t)
    return 2 * size ** 3 / best
