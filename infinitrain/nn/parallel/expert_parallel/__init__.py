"""Expert parallelism: the EP ranks of a group (carved out of DP x CP, layout.py) split a
mixture of experts' experts in contiguous blocks, and each MoE layer sends every token row to
the rank of its expert and back (Megatron-Core's all-to-all token dispatcher):

    xs, local_counts, handle = ep.dispatch(xs, order.counts)   # rows of my experts, from every rank
    h = <the local experts over xs, local_counts>
    ys = ep.combine(h, handle)                                 # my tokens' rows, back in my order

The counts are exchanged first (an all-to-all of ints, so each rank knows what it receives),
then the rows (all_to_all_single with those split sizes); the received rows are regrouped so
that each local expert's are consecutive. Both steps are differentiable (mappings.py): the
backward of one is the other's forward. The experts' parameters are marked
`param.expert_parallel = True`: their gradients are averaged over the expert data-parallel
group (DP x CP / EP ranks holding the same experts), the rest over DP x CP.
"""
from __future__ import annotations

import numpy as np

from .... import dtypes as _dt
from ....device import as_device
from ....tensor import Tensor, _empty
from ..process_group import ProcessGroup
from .mappings import Exchange, combine_rows, dispatch_rows

__all__ = ["ExpertParallel", "Exchange", "dispatch_rows", "combine_rows", "is_expert_param"]


def is_expert_param(p) -> bool:
    """Whether p is an expert's parameter under expert parallelism (the MoE layer marks them)."""
    return bool(getattr(p, "expert_parallel", False))


def require_expert_group(params, expert_group, who: str, argument: str, group=None) -> None:
    """Under expert parallelism each rank holds other experts: what reduces over `group` (or,
    with group None, adds up the experts' gradients) must be told the group that holds the same
    experts, or it would copy one rank's experts over the others' and mix different experts'
    gradients. Raises naming the argument to pass."""
    if expert_group is None and (group is None or group.size > 1) and any(is_expert_param(p) for p in params):
        raise ValueError(f"{who}: the model's experts are split over expert-parallel ranks (parameters marked "
                         f"expert_parallel): pass {argument}= (ParallelPlan's expert_gradient_group, or expert_group "
                         "for the EP ranks), as TrainStep does")


def _host_ints(values, device) -> Tensor:
    host = _empty((len(values),), _dt.int64, as_device("cpu"))
    np.copyto(host.numpy(), np.asarray(values, dtype=np.int64))
    return host if device.type == "cpu" else host.to(device=device)


class ExpertParallel:
    """group: the EP ranks that exchange tokens (the plan's expert_group); rank r holds the
    experts [r*E/EP, (r+1)*E/EP)."""

    def __init__(self, group: ProcessGroup):
        self.group = group

    @property
    def size(self) -> int:
        return self.group.size

    @property
    def rank(self) -> int:
        return self.group.rank

    def num_local_experts(self, num_experts: int) -> int:
        if not isinstance(num_experts, int) or num_experts < 1 or num_experts % self.size:
            raise ValueError(f"num_experts {num_experts} must be a positive multiple of --expert_parallel "
                             f"{self.size}: each EP rank holds num_experts / EP experts")
        return num_experts // self.size

    def local_experts(self, num_experts: int) -> range:
        """The global indices of the experts this rank holds (a contiguous block)."""
        n = self.num_local_experts(num_experts)
        return range(self.rank * n, (self.rank + 1) * n)

    def dispatch(self, xs: Tensor, counts) -> tuple:
        """xs [A, C]: token rows in global expert order, counts[e] of them for expert e (host
        ints, len num_experts). Returns (xs_local [A', C]: the rows every rank sends to this
        rank's experts, grouped by local expert, then by source rank; local_counts: rows per local
        expert; handle: what combine needs)."""
        counts = [int(c) for c in counts]
        local = self.num_local_experts(len(counts))
        if sum(counts) != xs.shape[0] or any(c < 0 for c in counts):
            raise ValueError(f"dispatch: counts {counts} must be >= 0 and add up to the {xs.shape[0]} rows of xs")
        n = self.size
        send = tuple(sum(counts[r * local:(r + 1) * local]) for r in range(n))
        # the counts first: what each rank receives from each, per local expert ([source][expert])
        mine = _host_ints(counts, xs.device)
        theirs = _empty((n * local,), _dt.int64, xs.device)
        self.group.all_to_all_single(theirs, mine)
        table = theirs.to(device="cpu").numpy().reshape(n, local).astype(np.int64)
        recv = tuple(int(v) for v in table.sum(1))
        starts = np.concatenate([[0], np.cumsum(table.reshape(-1))[:-1]]).reshape(n, local)
        by_expert = np.concatenate([np.arange(starts[s, e], starts[s, e] + table[s, e])
                                    for e in range(local) for s in range(n)] + [np.zeros(0, np.int64)])
        by_source = np.empty_like(by_expert)
        by_source[by_expert] = np.arange(by_expert.size)
        exchange = Exchange(self.group, send, recv, _host_ints(by_expert, xs.device),
                            _host_ints(by_source, xs.device))
        local_counts = tuple(int(v) for v in table.sum(0))
        return dispatch_rows(xs, exchange), local_counts, exchange

    def combine(self, ys_local: Tensor, handle: Exchange) -> Tensor:
        """The reverse of dispatch: ys_local's rows (in xs_local's order) back to the ranks and the
        places their tokens came from."""
        return combine_rows(ys_local, handle)

    def __repr__(self) -> str:
        return f"ExpertParallel(rank {self.rank} of {self.size}, ranks {self.group.ranks})"
