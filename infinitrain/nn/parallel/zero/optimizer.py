"""The ZeroOptimizer class (the design: the package's docstring). Its constructor reads as its
steps: check the arguments, group the parameters, plan the buckets (a unit's, or DDP's), pack
them (the parameters move into the buckets, this rank's pieces and gradient storage are made),
make this rank's segments, build the inner (maybe offloaded) optimizer over them, hand the
pieces to the store (offload_param), mirror the optimizer's settings on param_groups. Then the
step, zero_grad and gathered_parameters.

The rest of the class lives beside it: the gradient path in grads.py (ZeroGrads), the state
dicts in state.py (ZeroState), stage 3's parameters (partition, Gatherer, OffloadPieces) in
stage3.py.
"""
from __future__ import annotations

from contextlib import nullcontext

from ....autograd import no_grad
from ....optim.offload import offload_target, offloaded
from ....runtime import empty_cache
from ...parameter import Parameter
from ..expert_parallel import is_expert_param, require_expert_group
from ..param_buffer import ParamAndGradBuffer, broadcast_replicas, pack
from ..plan import check_offload
from .grads import ZeroGrads
from .shared import SharedUses, shared_parameters
from .stage3 import RELEASED, Gatherer, OffloadPieces, partition
from .state import ZeroState


# stage 2: a bucket holds at most this fraction of the model (and bucket_cap_mb), so that the
# full-size buckets in flight at stage 2 stay a small part of what it holds, whatever its size
BUCKETS_PER_MODEL = 16


def _check_arguments(stage: int, module, offload_optimizer, offload_param):
    """Refuses a stage, an offload or a missing model that cannot work; returns where the
    parameters are offloaded (offload_param's target, None: they stay in memory)."""
    if stage not in (1, 2, 3):
        raise ValueError(f"ZeRO stage must be 1, 2 or 3, got {stage}")
    check_offload(stage, offload_optimizer, offload_param)
    offload_param = offload_target(offload_param)
    if stage == 3 and module is None:
        raise ValueError("ZeRO-3 shards the parameters of a model: pass it, "
                         "ZeroOptimizer(..., stage=3, module=model)")
    return offload_param


class ZeroOptimizer(ZeroGrads, ZeroState):
    """optimizer_class(param_groups, **defaults) runs on this rank's shard. params: parameters
    or param groups (dicts with "params" and per-group options such as weight_decay).
    Stage 3 also needs the model (module=), whose parameters it takes over: they exist in full
    only while their module runs (see stage3.py). offload_optimizer "cpu" or "nvme" (with
    offload_path): this rank's shard of the optimizer state lives in host memory or on disk
    (OffloadOptimizer)."""

    def __init__(self, params, optimizer_class, dp_group, stage: int = 1,
                 bucket_cap_mb: float = 25.0, module=None, offload_optimizer: str | None = None,
                 offload_path=None, offload_param: str | None = None, expert_group=None, **defaults):
        offload_param = _check_arguments(stage, module, offload_optimizer, offload_param)
        self.stage, self.group = stage, dp_group
        self.world, self.rank = dp_group.size, dp_group.rank
        # under expert parallelism the experts' parameters (`expert_parallel`) are sharded over
        # the ranks holding the same experts, their gradients summed there and divided by DP x CP
        self.expert_group = expert_group if expert_group is not dp_group else None
        if self.expert_group is not None and offload_param is not None:
            raise ValueError("--offload_param does not compose with --expert_parallel yet")
        group_of, ordered = self._group_parameters(params)
        require_expert_group(ordered, expert_group, "ZeroOptimizer", "expert_group", dp_group)
        packs, tied, units, uses, shared = self._plan_buckets(module, ordered, group_of, bucket_cap_mb)
        self.buffer = ParamAndGradBuffer(packs, pad_to=lambda ps: self._group_of_pack(ps).size)
        self.buckets = self.buffer.buckets
        for b in self.buckets:  # the group that shards each bucket, this rank's index in it
            b.group = self._group_of_pack(b.params)
            b.rank = b.group.rank
            b.expert_scale = 1.0 / self.world if b.group is not self.group else None
        self._tied_buckets = self.buckets[len(self.buckets) - len(tied):] if tied and stage == 2 else []
        for b in self.buckets:  # a shared parameter's bucket: its gradient comes use by use (shared.py)
            b.shared = len(b.params) == 1 and any(b.params[0] is q for q in shared)
        self._pack_buckets(offload_param)
        # stage 3: the gathering around each unit's forward and backward
        self.gatherer = Gatherer(dp_group, self.buckets, units, uses,
                                 {k: v[0] for k, v in self.buffer.where.items()}) if stage == 3 else None
        inner_groups = self._make_segments(group_of)
        self.optimizer = offloaded(optimizer_class(inner_groups, **defaults), offload_optimizer, offload_path,
                                   offload_params=offload_param is not None) if inner_groups else None
        self._offload_pieces(offload_param)
        self.optimizer_class = optimizer_class
        self.state_type = optimizer_class.__name__  # state_dict() is that optimizer's, whole
        self._mirror_settings(defaults)
        self._init_grad_sync()
        self.shared_uses = SharedUses(module, [b.params[0] for b in self.buckets if b.shared],
                                      self._on_shared_grad) if any(b.shared for b in self.buckets) else None

    # ---- the constructor's steps ------------------------------------------------------------
    def _group_parameters(self, params) -> tuple:
        """param_groups of the parameters that require grad; returns (id(parameter) -> its
        group, the parameters each once in order), refusing none or mixed dtypes."""
        groups = list(params)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.param_groups = [dict(g, params=[p for p in g["params"] if p.requires_grad]) for g in groups]
        group_of, ordered = {}, []
        for gi, g in enumerate(self.param_groups):
            for p in g["params"]:
                if id(p) not in group_of:
                    group_of[id(p)] = gi
                    ordered.append(p)
        if not ordered:
            raise ValueError("ZeroOptimizer got no parameters that require grad")
        dtypes = {p.dtype.name for p in ordered}
        if len(dtypes) != 1:
            raise ValueError(f"ZeroOptimizer needs parameters of one dtype, got {sorted(dtypes)}")
        return group_of, ordered

    def _plan_buckets(self, module, ordered, group_of, bucket_cap_mb) -> tuple:
        """(the parameters of each bucket, the tied parameters, stage 3's units and the
        parameters each uses, the shared parameters whose uses hand their gradients over one
        by one: shared.py)."""
        # a pipeline's tied embedding (GPT-2's on the first and last stage) gets a bucket of its
        # own on both, so that the two stages' pieces line up and their gradients can be summed
        tied = module.tied_parameters() if module is not None and hasattr(module, "tied_parameters") else []
        tied = [p for p in tied if id(p) in group_of]
        shared = self._shared_parameters(module, ordered, tied)
        units = uses = None
        if self.stage == 3:  # a bucket per unit of the model
            if tied:  # (ParallelPlan refuses the layout; this is a model built so by hand)
                raise ValueError("ZeRO-3 cannot shard a model whose tied parameters a pipeline holds on two stages")
            units, owned, uses = partition(module, ordered)
            # a unit's experts in a bucket of their own (sharded over their group)
            packs = [part for ps in owned for part in ([q for q in ps if not is_expert_param(q)],
                                                       [q for q in ps if is_expert_param(q)])]
            # a shared parameter is handed over use by use only where it has its unit's bucket alone
            shared = [p for p in shared if any(len(ps) == 1 and ps[0] is p for ps in packs)]
        else:  # the buckets DDP would reduce whole (stage 2: at most a sixteenth of the model each,
            # as they are in flight full-size); a tied or shared parameter alone, last
            alone = tied + shared
            rest = [p for p in ordered if not any(p is q for q in alone)]
            cap = bucket_cap_mb if self.stage == 1 else \
                min(bucket_cap_mb, sum(p.nbytes for p in ordered) / BUCKETS_PER_MODEL / 2**20)
            packs = pack(rest, cap) + [[p] for p in alone]
        return packs, tied, units, uses, shared

    @staticmethod
    def _shared_parameters(module, ordered, tied) -> list:
        """The parameters several modules hold (a tied embedding) whose gradients are handed
        over use by use (shared.py): not under a pipeline (whose schedules defer weight
        gradients, and sum a tied parameter over two stages), not experts, not SP's partial ones."""
        if module is None or tied or getattr(module, "pp", None) is not None:
            return []
        return [p for p in shared_parameters(module, ordered)
                if not is_expert_param(p) and getattr(p, "partial_grad_group", None) is None]

    def _group_of_pack(self, params):
        """The group that shards a bucket of these parameters (pack keeps experts apart)."""
        return self.expert_group if self.expert_group is not None and is_expert_param(params[0]) else self.group

    def _pack_buckets(self, offload_param) -> None:
        """Bucket by bucket: the parameters move into it, every rank gets rank 0's values, this
        rank's piece (stage 3: the only copy) and its gradient storage are made."""
        with no_grad():
            for b in self.buckets:
                b.hold_params()  # the parameters now live in their bucket
                for p in b.params:
                    p.grad = None
                    p.register_post_accumulate_grad_hook(self._on_grad)
                broadcast_replicas([b.flat_param], b.group)
                b.shard_param = b.shard(b.flat_param, b.rank)  # this rank's piece (stage 3: its own copy)
                b.pending = len(b.params)
                if self.stage == 3:  # the piece becomes the only copy, before the next bucket is packed
                    b.shard_param = b.shard_param.clone()
                    b.flat_param._storage.release(RELEASED)
                # the parameters' storage before they moved into the bucket (and what stage 3 just
                # released) back to the system as each bucket is packed: the allocator would keep
                # it cached for sizes no step asks for again, and a big model would hold twice
                # its weights while it is packed
                empty_cache(b.device)
                self._make_grad_storage(b, offload_param)

    def _make_segments(self, group_of) -> list:
        """This rank's segments: a shard parameter per (bucket piece ∩ parameter), in the group
        of its parameter. Returns the inner optimizer's groups (those with a segment here)."""
        inner_groups = [dict({k: v for k, v in g.items() if k != "params"}, params=[])
                        for g in self.param_groups]
        self.segments = []
        for bi, b in enumerate(self.buckets):
            lo, hi = b.rank * b.piece, (b.rank + 1) * b.piece
            for j, p in enumerate(b.params):
                s, e = max(lo, b.offsets[j]), min(hi, b.offsets[j] + p.numel())
                if s < e:
                    shard = Parameter(b.shard_param[s - lo:e - lo])
                    shard.grad = b.shard_grad[s - lo:e - lo]
                    inner_groups[group_of[id(p)]]["params"].append(shard)
                    self.segments.append((shard, bi, s - lo, p, s - b.offsets[j]))
        self._inner_of = [gi for gi, g in enumerate(inner_groups) if g["params"]]
        return [g for g in inner_groups if g["params"]]

    def _offload_pieces(self, offload_param) -> None:
        """offload_param: the store holds the pieces now (a rank without any keeps its padding),
        and the gradient shards get their memory."""
        self.offloaded_pieces = None
        if offload_param is not None and self.optimizer is not None:
            self.offloaded_pieces = OffloadPieces(self.optimizer, self.buckets, self.segments,
                                                  self._inner_params(), self.world)
        if self.gatherer is not None:
            self.gatherer.pieces = self.offloaded_pieces
        empty_cache(self.buckets[0].device)  # the pieces offload_param released
        if offload_param is not None:
            self._allocate_released_grad_shards()

    def _mirror_settings(self, defaults) -> None:
        """param_groups show the optimizer's settings (lr, ...), also for a group with no
        element on this rank, so that a scheduler works on every rank alike."""
        for g in self.param_groups:
            for key, v in defaults.items():
                g.setdefault(key, v)
        if self.optimizer is not None:
            for k, gi in enumerate(self._inner_of):
                for key, v in self.optimizer.param_groups[k].items():
                    if key != "params":
                        self.param_groups[gi].setdefault(key, v)

    # ---- the step -----------------------------------------------------------------------------
    @no_grad()
    def step(self) -> None:
        self.finish_grad_sync()
        if self.offloaded_pieces is not None:  # a read ahead of the step would be stale after it
            self.offloaded_pieces.discard()
        if self.optimizer is not None:
            for k, gi in enumerate(self._inner_of):  # a scheduler sets lr on param_groups
                inner = self.optimizer.param_groups[k]
                inner.update({key: v for key, v in self.param_groups[gi].items() if key != "params"})
            self.optimizer.step()
        if self.stage == 3:  # the pieces are the parameters; each unit gathers them when it runs
            return
        # every rank's updated piece, to every rank; this rank's piece is written with the values
        # it holds, which an offloaded optimizer's host masters need not read back
        with getattr(self.optimizer, "same_weights", nullcontext)():
            for b in self.buckets:
                b.group.all_gather(b.flat_param, b.shard_param.clone())

    def gathered_parameters(self, write: bool = False):
        """A context in which every parameter of the model is whole (stage 3 gathers them; the
        other stages keep them whole anyway): for checkpoints, evaluation by hand, inspection.
        write=True: what every rank wrote into them (loading a checkpoint) becomes the shards."""
        return self.gatherer.gathered(write) if self.gatherer is not None else nullcontext()

    @no_grad()
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zeroes the gradient shards (and, stage 1, the flat gradients the .grad views show)."""
        for b in self.buckets:
            if self.stage == 1:  # the shard is a piece of the flat gradient
                b.flat_grad.zero_()
                for j, p in enumerate(b.params):
                    p.grad = b.grad_view(j)
            else:
                b.shard_grad.zero_()
                b.shard_zero = True
                b.flat_grad = None
                for p in b.params:
                    p.grad = None
        self._sharded = False

    def __repr__(self) -> str:
        n = sum(seg[0].numel() for seg in self.segments)
        return (f"ZeroOptimizer(stage {self.stage}, rank {self.rank} of {self.world}, "
                f"{len(self.buckets)} buckets, {n} elements of optimizer state here)")
