"""How a sequence is split over a CP group, and the model-facing handle of context parallelism.

Balanced (head-tail, Megatron's and TorchTitan's): the sequence is cut into 2·CP equal chunks
and rank r holds chunks r and 2·CP-1-r, one from the front and its mirror from the back. Under
causal masking chunk i attends to i+1 chunks, so every rank's pair attends to 2·CP+1 chunks:
the same work everywhere. Contiguous (picotron's): CP chunks, rank r holds chunk r, so the last
rank does CP times the first one's attention; kept to measure the difference."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .... import creation
from ....autograd import Function
from ....ops.shape import cat
from ....tensor import Tensor
from ..process_group import ProcessGroup
from ..tensor_parallel.mappings import _all_gather_dim
from .order import narrow, to_sequence_order

COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")


@dataclass
class ContextParallel:
    """What a model needs to run context-parallel: the CP group, how attention communicates
    ("p2p": K/V around a ring, overlapped with the block products; "all_gather": K/V gathered
    at once, for small groups; "a2a": the heads split over CP inside attention, DeepSpeed-
    Ulysses; "a2a+p2p": the heads split over groups of a2a_size neighbours, a ring across the
    groups) and how the sequence is split (balanced: head-tail). Building one with a2a+p2p is
    collective over the group (it splits it)."""
    group: ProcessGroup
    comm_type: str = "p2p"
    balanced: bool = True
    a2a_size: int | None = None  # a2a+p2p: the ranks of each all-to-all group (default: all)
    _positions: dict = field(default_factory=dict, repr=False)
    ring_open: bool = field(default=False, repr=False)  # the ring's p2p links are made (ring_attention)

    def __post_init__(self):
        if self.comm_type not in COMM_TYPES:
            raise ValueError(f"context parallel communication must be one of {COMM_TYPES}, "
                             f"got {self.comm_type!r}")
        self._hybrid = None
        # what attention runs: "a2a+p2p" with groups of the whole CP group is plain a2a, with
        # groups of one rank the plain ring
        self._attention = self.comm_type
        if self.comm_type == "a2a+p2p":
            A = self.size if self.a2a_size is None else self.a2a_size
            if not isinstance(A, int) or A < 1 or self.size % A:
                raise ValueError(f"--cp_a2a_size {A} must divide context parallel {self.size}")
            if 1 < A < self.size:
                self._hybrid = _hybrid_groups(self, A)
            else:
                self._attention = "a2a" if A == self.size else "p2p"

    @property
    def member_chunks(self) -> list:
        """Every rank's chunks, in rank order (what an all-to-all over the whole group holds)."""
        return [self.chunks(r) for r in range(self.size)]

    @property
    def size(self) -> int:
        return self.group.size

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def n_chunks(self) -> int:
        return 2 * self.size if self.balanced else self.size

    def chunks(self, rank: int | None = None) -> tuple:
        """The chunks of the sequence a rank holds, in order (ascending)."""
        r = self.rank if rank is None else rank
        return (r, 2 * self.size - 1 - r) if self.balanced else (r,)

    def check_sequence(self, T: int, tp_multiple: int = 1) -> None:
        """T must split into n_chunks equal chunks, and (sequence parallelism) this rank's T/CP
        tokens into tp_multiple equal parts."""
        n = self.n_chunks
        if T % n or (T // self.size) % tp_multiple:
            extra = f" x tensor parallel {tp_multiple} (sequence parallelism)" if tp_multiple > 1 else ""
            raise ValueError(f"context parallel {self.size} splits each sequence into {n} equal chunks"
                             f"{' (head-tail)' if self.balanced else ''}{extra}: the sequence length {T} "
                             f"must be a multiple of {math.lcm(n, self.size * tp_multiple)}")

    def local_len(self, T: int) -> int:
        return T // self.size

    def positions(self, T: int, device) -> Tensor:
        """The global positions (int64 [T/CP]) of this rank's tokens, in its order."""
        key = (T, str(device))
        if key not in self._positions:
            c = T // self.n_chunks
            pos = np.concatenate([np.arange(i * c, (i + 1) * c) for i in self.chunks()])
            self._positions[key] = creation.from_numpy(pos.astype(np.int64)).to(device=device)
        return self._positions[key]

    def shard(self, x: Tensor, dim: int = 1) -> Tensor:
        """This rank's chunks of a whole-sequence tensor along dim (token ids, targets)."""
        dim %= x.ndim
        c = x.shape[dim] // self.n_chunks
        return cat([narrow(x, dim, i * c, c) for i in self.chunks()], dim).contiguous()

    def gather(self, x: Tensor, dim: int = 1) -> Tensor:
        """The whole sequence along dim from every rank's part, in sequence order
        (differentiable: the backward takes this rank's chunks of the gradient)."""
        return _GatherSequence.apply(x, self, dim % x.ndim)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, scale: float | None = None) -> Tensor:
        """Causal attention of this rank's queries [B, H, T/CP, D] over the whole sequence's
        keys and values (k, v: this rank's [B, H_kv, T/CP, D])."""
        from .... import amp
        from .a2a_attention import a2a_attention
        from .all_gather_attention import AllGatherAttention
        from .ring_attention import RingAttention
        q, k, v = amp.lower(q, k, v)  # bf16 products under autocast, merged in float32
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        if self._hybrid is not None:
            inner, ring = self._hybrid
            return a2a_attention(q, k, v, inner, scale, ring)
        if self._attention == "a2a":
            return a2a_attention(q, k, v, self, scale)
        return (RingAttention if self._attention == "p2p" else AllGatherAttention).apply(q, k, v, self, scale)

    def loss(self, local_sum: Tensor, targets: Tensor, ignore_index: int = -100) -> Tensor:
        """The mean loss over the whole sequences, from this rank's sum over its tokens."""
        from .loss import loss_over_cp
        return loss_over_cp(local_sum, targets, self.group, ignore_index)


@dataclass
class AllToAllGroup:
    """a2a+p2p's all-to-all: A neighbouring CP ranks and the chunks each holds."""
    group: ProcessGroup
    member_chunks: list

    @property
    def size(self) -> int:
        return self.group.size


@dataclass
class Ring:
    """a2a+p2p's ring across the all-to-all groups, as ring attention reads a ContextParallel:
    member g holds the chunks of all-to-all group g (ascending)."""
    group: ProcessGroup
    member_chunks: list
    ring_open: bool = False

    @property
    def size(self) -> int:
        return self.group.size

    @property
    def rank(self) -> int:
        return self.group.rank

    def chunks(self, rank: int | None = None) -> tuple:
        return self.member_chunks[self.rank if rank is None else rank]


def _hybrid_groups(cp: ContextParallel, A: int) -> tuple:
    """(AllToAllGroup, Ring) of this rank: CP rank c is in all-to-all group c // A (neighbours)
    and ring c % A."""
    c, g = cp.rank, cp.rank // A
    inner = AllToAllGroup(cp.group.split(g), [cp.chunks(g * A + m) for m in range(A)])
    held = [tuple(sorted(ch for m in range(A) for ch in cp.chunks(j * A + m))) for j in range(cp.size // A)]
    return inner, Ring(cp.group.split(c % A), held)


class _GatherSequence(Function):
    """All-gather along the sequence in forward (into sequence order); this rank's chunks of the
    gradient in backward."""

    @staticmethod
    def forward(ctx, x, cp, dim):
        ctx.cp, ctx.dim = cp, dim
        return to_sequence_order(_all_gather_dim(x, cp.group, dim), cp, dim).contiguous()

    @staticmethod
    def backward(ctx, g):
        return ctx.cp.shard(g, ctx.dim), None, None
