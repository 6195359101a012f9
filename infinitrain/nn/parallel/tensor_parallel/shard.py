"""How a tensor-parallel layout is described: the TP group (TensorParallel), how a parameter is
cut over it (TPShard, `param.tp_shard`), and which replicated parameters get partial gradients
(`param.partial_grad_group`, summed over TP after backward by nn.parallel.finalize)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .... import creation
from ....autograd import no_grad
from ....tensor import Tensor
from ...module import Module
from ...parameter import Parameter
from ..process_group import ProcessGroup


@dataclass(frozen=True)
class TensorParallel:
    """What a model needs to know to build its layers tensor-parallel: the TP group, whether
    activations between TP regions are split along the sequence, and whether column-parallel
    layers overlap backward's collectives with its products (async_comm, Megatron's
    async_tensor_model_parallel_allreduce; the same results either way)."""
    group: ProcessGroup
    sequence_parallel: bool = False
    async_comm: bool = True

    @property
    def size(self) -> int:
        return self.group.size

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def generator(self):
        """Dropout's stream for activations split over TP (heads, hidden units): a fork of the
        default generator salted with the TP rank (Megatron's seed + 2718 + rank), so each rank's
        part draws its own mask while replicated activations draw the same one on every rank."""
        from ....random import ForkedGenerator, default_generator
        return ForkedGenerator(default_generator, 2718 + self.rank)

    @property
    def sequence_split(self) -> int:
        """How many parts a sequence's activations are split into between TP regions: TP under
        sequence parallelism, else 1."""
        return self.size if self.sequence_parallel else 1

    def check_divisible(self, what: str, n: int) -> int:
        """n // TP, or a clear error naming the sizes."""
        if n % self.size:
            raise ValueError(f"tensor parallel {self.size} does not divide {what} ({n}); choose a "
                             f"tensor-parallel size that divides {n}")
        return n // self.size


class TPShard:
    """How a parameter is split: along `dim`, the full tensor is a run of `blocks` (for a fused
    q|k|v weight, three blocks), and each block is cut into `group.size` equal pieces; rank r
    holds piece r of every block, in block order. `full_size` (one block only) is the true size
    along dim when the blocks were padded to a multiple of the group (a vocabulary of 50257 on
    TP 2 is held as 2 x 25129 rows, the last one zero)."""

    def __init__(self, group: ProcessGroup, dim: int, blocks, full_size: int | None = None):
        self.group, self.dim, self.blocks = group, dim, tuple(int(b) for b in blocks)
        for b in self.blocks:
            if b % group.size:
                raise ValueError(f"a block of {b} along dim {dim} cannot be split over "
                                 f"tensor parallel {group.size}")
        if full_size is not None and len(self.blocks) != 1:
            raise ValueError("padding is supported for single-block shards only")
        self.full_size = full_size if full_size is not None else sum(self.blocks)

    def full_shape(self, local_shape) -> tuple:
        s = list(local_shape)
        s[self.dim] = self.full_size
        return tuple(s)

    def pieces(self, rank: int):
        """(start, stop) along dim of rank's pieces in the padded full tensor."""
        at, out = 0, []
        for b in self.blocks:
            n = b // self.group.size
            out.append((at + rank * n, at + (rank + 1) * n))
            at += b
        return out

    def take(self, full: Tensor) -> Tensor:
        """This rank's part of the full tensor (a contiguous copy)."""
        a = _as_numpy(full)
        if a.shape[self.dim] != self.full_size:
            raise ValueError(f"expected {self.full_size} along dim {self.dim}, got shape {a.shape}")
        pad = sum(self.blocks) - self.full_size
        if pad:
            widths = [(0, 0)] * a.ndim
            widths[self.dim] = (0, pad)
            a = np.pad(a, widths)
        parts = [np.take(a, np.arange(s, e), axis=self.dim) for s, e in self.pieces(self.group.rank)]
        return _from_numpy(np.ascontiguousarray(np.concatenate(parts, axis=self.dim)), full.dtype, full.device)

    @no_grad()
    def gather(self, local: Tensor) -> Tensor:
        """The full tensor from every rank's part (a collective over the group)."""
        src = local.detach().contiguous()
        buf = creation.empty(self.group.size, *src.shape, dtype=src.dtype, device=src.device)
        self.group.all_gather(buf, src)
        g = _as_numpy(buf)
        n = [b // self.group.size for b in self.blocks]
        parts, at = [], 0
        for k in n:  # block by block: the pieces of every rank, in rank order
            for r in range(self.group.size):
                parts.append(np.take(g[r], np.arange(at, at + k), axis=self.dim))
            at += k
        full = np.concatenate(parts, axis=self.dim)
        full = np.take(full, np.arange(self.full_size), axis=self.dim)
        return _from_numpy(np.ascontiguousarray(full), local.dtype, local.device)


def load_full(p: Tensor, full: Tensor) -> None:
    """The inverse of full_tensor: copies a one-process tensor into the parameter, which keeps
    its tensor-parallel slice of it (no communication: every rank has the full tensor)."""
    shard = getattr(p, "tp_shard", None)
    p.copy_(shard.take(full) if shard is not None else full)


def full_tensor(p: Tensor) -> Tensor:
    """The one-process tensor of a parameter, detached: a tensor-parallel shard is gathered (a
    collective over its TP group, so every rank of the group must call this)."""
    shard = getattr(p, "tp_shard", None)
    return shard.gather(p) if shard is not None else p.detach()


def _as_numpy(t: Tensor) -> np.ndarray:
    return t.detach().contiguous().cpu().numpy()


def _from_numpy(a: np.ndarray, dtype, device) -> Tensor:
    return creation.from_numpy(a).to(dtype=dtype, device=device)


def shard_param(shape, shard: TPShard, dtype) -> Parameter:
    p = Parameter(creation.empty(*shape, dtype=dtype))
    p.tp_shard = shard
    return p


def sequence_split(tp: TensorParallel | None) -> int:
    """TensorParallel.sequence_split, 1 without TP (tp None)."""
    return tp.sequence_split if tp is not None else 1


def mark_sequence_parallel(module: Module, tp: TensorParallel | None) -> None:
    """Marks every parameter of a module that sees sequence-split activations under SP (norms,
    row-parallel biases, position embeddings): their gradients are summed over TP."""
    if tp is not None and tp.sequence_parallel:
        for p in module.parameters():
            if getattr(p, "tp_shard", None) is None:
                p.partial_grad_group = tp.group



def mark_sequence_parallel_param(p: Parameter, tp: TensorParallel) -> None:
    if tp.sequence_parallel:
        p.partial_grad_group = tp.group
