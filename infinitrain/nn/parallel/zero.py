"""ZeRO (stages 1, 2 and 3): the optimizer's state, with stage 2 also the gradients, with stage
3 also the parameters, sharded over the data-parallel group, as DeepSpeed describes them. It
replaces DDP: gradients are averaged over DP by the reduce-scatter that shards them.

Layout. The parameters (in reverse registration order, roughly the order backward produces
their gradients) are packed into flat buckets, each padded to a multiple of DP; rank r owns
piece r of every bucket. The parameters become views into the buckets, so that one all-gather
per bucket after the step refreshes them all. Rank r's optimizer sees one 1-D "shard
parameter" per (bucket piece ∩ parameter) segment, a view into the same memory, in the group
of the parameter it is part of (so weight-decay masks come from the original parameters, not
from the flat shard).

Gradients. Stage 1 keeps full flat gradients: each .grad is a view into its bucket, so
backward accumulates in place (micro-batches too), and step() reduce-scatters every bucket in
place: this rank's shard is its own piece of the bucket (no second copy; after the step the
.grad views show the reduced piece here and what the reduction left elsewhere, until zero_grad). Stage 2 keeps only the shards: a post-accumulate-grad hook moves each
gradient into its bucket (allocated when the bucket's first gradient lands) and drops .grad;
the bucket is reduce-scattered as soon as its last gradient has landed (overlapped with the
rest of backward), this rank's piece added into its shard and the full-size bucket freed;
with gradient accumulation every micro-batch is reduced so (DeepSpeed's way).

Stage 3 reduces gradients as stage 2 does, with one bucket per unit of the model (zero3.py):
this rank's pieces are the only persistent copy of the parameters, gathered around each unit's
forward and backward, so the step updates the pieces and gathers nothing. With offload_param
(ZeRO-Infinity's), the pieces too live where the optimizer state is offloaded (zero3.OffloadPieces):
a unit's piece is read just ahead of its gather and dropped once gathered, and the step updates
the pieces there, so no parameter stays in memory between uses.
"""
from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from ...autograd import no_grad
from ...autograd.engine import queue_callback
from ...creation import empty, from_numpy, zeros
from ...optim.offload import offload_target, offloaded
from ...runtime import empty_cache
from ..parameter import Parameter
from ..utils import scale_, total_norm
from . import zero3
from .finalize import reduce_partial_grads
from .plan import check_offload
from .param_buffer import ParamAndGradBuffer, broadcast_replicas, mark_ready, pack
from .process_group import ReduceOp


class ZeroOptimizer:
    """optimizer_class(param_groups, **defaults) runs on this rank's shard. params: parameters
    or param groups (dicts with "params" and per-group options such as weight_decay).
    Stage 3 also needs the model (module=), whose parameters it takes over: they exist in full
    only while their module runs (see zero3.py). offload_optimizer "cpu" or "nvme" (with
    offload_path): this rank's shard of the optimizer state lives in host memory or on disk
    (OffloadOptimizer)."""

    def __init__(self, params, optimizer_class, dp_group, stage: int = 1,
                 bucket_cap_mb: float = 25.0, module=None, offload_optimizer: str | None = None,
                 offload_path=None, offload_param: str | None = None, **defaults):
        if stage not in (1, 2, 3):
            raise ValueError(f"ZeRO stage must be 1, 2 or 3, got {stage}")
        check_offload(stage, offload_optimizer, offload_param)
        offload_param = offload_target(offload_param)
        if stage == 3 and module is None:
            raise ValueError("ZeRO-3 shards the parameters of a model: pass it, "
                             "ZeroOptimizer(..., stage=3, module=model)")
        self.stage, self.group = stage, dp_group
        self.world, self.rank = dp_group.size, dp_group.rank
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
        # a pipeline's tied embedding (GPT-2's on the first and last stage) gets a bucket of its
        # own on both, so that the two stages' pieces line up and their gradients can be summed
        tied = module.tied_parameters() if module is not None and hasattr(module, "tied_parameters") else []
        tied = [p for p in tied if id(p) in group_of]
        if stage == 3:  # a bucket per unit of the model
            if tied:  # (ParallelPlan refuses the layout; this is a model built so by hand)
                raise ValueError("ZeRO-3 cannot shard a model whose tied parameters a pipeline holds on two stages")
            units, owned, uses = zero3.partition(module, ordered)
            packs = owned
        else:  # the buckets DDP would reduce whole; a tied parameter alone, last
            packs = pack([p for p in ordered if not any(p is q for q in tied)], bucket_cap_mb) + [[p] for p in tied]
        self.buffer = ParamAndGradBuffer(packs, pad_to=self.world)
        self.buckets = self.buffer.buckets
        self._tied_buckets = self.buckets[len(self.buckets) - len(tied):] if tied and stage == 2 else []
        with no_grad():
            for b in self.buckets:
                b.hold_params()  # the parameters now live in their bucket
                for p in b.params:
                    p.grad = None
                    p.register_post_accumulate_grad_hook(self._on_grad)
                broadcast_replicas([b.flat_param], self.group)
                b.shard_param = b.shard(b.flat_param, self.rank)  # this rank's piece (stage 3: its own copy)
                b.pending = len(b.params)
                if stage == 3:  # the piece becomes the only copy, before the next bucket is packed
                    b.shard_param = b.shard_param.clone()
                    b.flat_param._storage.release(zero3.RELEASED)
                # the parameters' storage before they moved into the bucket (and what stage 3 just
                # released) back to the system as each bucket is packed: the allocator would keep
                # it cached for sizes no step asks for again, and a big model would hold twice
                # its weights while it is packed
                empty_cache(b.device)
                if stage == 1:  # the shard is this rank's piece of the full gradient, reduced in place
                    b.flat_grad = b.new_flat()
                    b.shard_grad = b.shard(b.flat_grad, self.rank)
                    for j, p in enumerate(b.params):
                        p.grad = b.grad_view(j)
                else:
                    b.shard_grad = zeros(b.piece, dtype=b.dtype, device=b.device)
                    if offload_param is not None:  # made once the pieces are gone (below): half the peak
                        b.shard_grad._storage.release("ZeRO-3's gradient shard before its memory is made")
        # stage 3: the gathering around each unit's forward and backward
        self.gatherer = zero3.Gatherer(dp_group, self.buckets, units, uses,
                                       {k: v[0] for k, v in self.buffer.where.items()}) if stage == 3 else None
        # this rank's segments: a shard parameter per (bucket piece ∩ parameter)
        inner_groups = [dict({k: v for k, v in g.items() if k != "params"}, params=[])
                        for g in self.param_groups]
        self.segments = []
        for bi, b in enumerate(self.buckets):
            lo, hi = self.rank * b.piece, (self.rank + 1) * b.piece
            for j, p in enumerate(b.params):
                s, e = max(lo, b.offsets[j]), min(hi, b.offsets[j] + p.numel())
                if s < e:
                    shard = Parameter(b.shard_param[s - lo:e - lo])
                    shard.grad = b.shard_grad[s - lo:e - lo]
                    inner_groups[group_of[id(p)]]["params"].append(shard)
                    self.segments.append((shard, bi, s - lo, p, s - b.offsets[j]))
        self._inner_of = [gi for gi, g in enumerate(inner_groups) if g["params"]]
        inner_groups = [g for g in inner_groups if g["params"]]
        self.optimizer = offloaded(optimizer_class(inner_groups, **defaults), offload_optimizer, offload_path,
                                   offload_params=offload_param is not None) if inner_groups else None
        # offload_param: the store holds the pieces now (a rank without any keeps its padding)
        self.offloaded_pieces = zero3.OffloadPieces(self.optimizer, self.buckets, self.segments, self._inner_params(),
                                              self.world) if offload_param is not None and self.optimizer is not None else None
        if self.gatherer is not None:
            self.gatherer.pieces = self.offloaded_pieces
        empty_cache(self.buckets[0].device)  # the pieces offload_param released
        if offload_param is not None:
            for b in self.buckets:
                b.shard_grad._storage.allocate(b.piece * b.shard_grad.itemsize)
                b.shard_grad.zero_()
        self.optimizer_class = optimizer_class
        self.state_type = optimizer_class.__name__  # state_dict() is that optimizer's, whole
        # param_groups show the optimizer's settings (lr, ...), also for a group with no
        # element on this rank, so that a scheduler works on every rank alike
        for g in self.param_groups:
            for key, v in defaults.items():
                g.setdefault(key, v)
        if self.optimizer is not None:
            for k, gi in enumerate(self._inner_of):
                for key, v in self.optimizer.param_groups[k].items():
                    if key != "params":
                        self.param_groups[gi].setdefault(key, v)
        self._callback_queued = False
        self._ready = set()  # parameters whose gradient is final in this backward pass
        # stages 2 and 3: called as on_reduced(shard parameters) when a bucket's reduce-scatter
        # has landed in this rank's shard (an OffloadOptimizer streams them to the host then); a
        # tied parameter's shard is left out, as finalize_grads still sums it over the pipeline
        self.on_reduced = None
        self._shards_of = {}  # id(bucket) -> this rank's shard parameters in it
        for shard, bi, _, _, _ in self.segments:
            self._shards_of.setdefault(id(self.buckets[bi]), []).append(shard)
        for b in self._tied_buckets:
            self._shards_of.pop(id(b), None)
        self._works = []
        self._sharded = False  # this step's gradients are final: reduce-scattered (stage 1), tied summed

    # ---- gradients --------------------------------------------------------------------------
    @no_grad()
    def _on_grad(self, p) -> None:
        bi, j = self.buffer.locate(p)
        b = self.buckets[bi]
        if self.stage == 1:
            if p.grad._storage is not b.flat_grad._storage:  # .grad was reset behind our back
                view = b.grad_view(j)
                view.add_(p.grad)
                p.grad = view
            return
        if not self._callback_queued:
            queue_callback(self._finish_backward)
            self._callback_queued = True
        mark_ready(self._ready, p)
        reduce_partial_grads([p])  # SP, LoRA: summed over TP now, before this rank's .grad is dropped
        if b.flat_grad is None and len(b.params) == 1 and b.padded == p.numel() and p.grad.is_contiguous():
            b.flat_grad = p.grad.view(-1)  # a bucket of one parameter: its gradient, no copy
        else:
            if b.flat_grad is None:
                b.flat_grad = b.new_flat()
            b.grad_view(j).add_(p.grad)
        p.grad = None  # the flat bucket holds it now
        b.pending -= 1
        if b.pending == 0:
            self._reduce(b)
            self._collect(keep=1)  # at most one bucket in flight: memory bounded, overlap kept
            if self.gatherer is not None:
                self.gatherer.grads_done(bi)

    def _reduce(self, b) -> None:
        """Stage 2: this bucket's reduce-scatter starts now; its full gradient is freed when
        it is done (at the end of backward). One rank (offload_param's ZeRO-3): the gradient
        is the shard's, added now."""
        if self.world == 1:
            b.shard_grad.add_(b.flat_grad)
            b.flat_grad, b.pending = None, -1
            self._landed(b)
            return
        out = empty(b.piece, dtype=b.dtype, device=b.device)
        self._works.append((b, out, self.group.reduce_scatter(out, b.flat_grad, ReduceOp.AVG, async_op=True)))
        b.pending = -1  # launched

    def _collect(self, keep: int = 0) -> None:
        """Waits for all but the newest `keep` reduce-scatters, adds them into the shards and
        frees their full-size buckets."""
        done, self._works = self._works[:len(self._works) - keep], self._works[len(self._works) - keep:]
        for b, out, work in done:
            work.wait()
            b.shard_grad.add_(out)
            b.flat_grad = None
            self._landed(b)

    def _landed(self, b) -> None:
        if self.on_reduced is not None:
            self.on_reduced(self._shards_of.get(id(b), []))

    def _finish_backward(self) -> None:
        for b in self.buckets:  # a parameter that got no gradient contributes zeros
            if b.pending >= 0:
                if b.flat_grad is None:
                    b.flat_grad = b.new_flat()
                self._reduce(b)
        self._collect()
        for b in self.buckets:
            b.pending = len(b.params)
        self._callback_queued = False
        self._ready = set()

    @no_grad()
    def finish_grad_sync(self) -> None:
        """The one door through which a step's DP reduction completes (finalize_grads calls it
        once per step, before the norm or the step): stage 1 reduce-scatters every bucket's full
        gradient into its shard (stages 2 and 3 did during backward, each micro-batch's at its
        backward's end)."""
        if self._sharded:
            return
        if self.stage == 1:
            for b in self.buckets:
                self.group.reduce_scatter(b.shard_grad, b.flat_grad, ReduceOp.AVG)
        self._sharded = True

    def tied_grad_shards(self) -> list:
        """Stage 2 under a pipeline: this rank's piece of each tied parameter's gradient (the
        parameter's .grad is gone), which finalize_grads sums over the first and last stage
        like the full gradients of stage 1 (each tied parameter has a bucket of its own, so the
        two stages' pieces line up)."""
        return [b.shard_grad for b in self._tied_buckets]

    # ---- the step -----------------------------------------------------------------------------
    @no_grad()
    def clip_grad_norm_(self, max_norm: float, pipeline_group=None) -> float:
        """One global 2-norm over every rank's gradient shard (the one-process norm: under TP,
        squares of tensor-parallel shards are also summed over TP, replicated parameters
        counted once; under PP, summed over the pipeline's stages, a stage's copy of a tied
        parameter left out); scales the shards when it exceeds max_norm. Returns the norm
        before clipping."""
        self.finish_grad_sync()
        pairs = [(p, shard.grad) for shard, _, _, p, _ in self.segments]
        total = total_norm(pairs, self.buckets[0].device, dp_group=self.group, pipeline_group=pipeline_group)
        scale_([b.shard_grad for b in self.buckets], max_norm, total)
        return total

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
        for b in self.buckets:  # every rank's updated piece, to every rank
            self.group.all_gather(b.flat_param, b.shard_param.clone())

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
                b.flat_grad = None
                for p in b.params:
                    p.grad = None
        self._sharded = False

    # ---- state: in one process's form, so that checkpoints are layout-free ------------------
    def _original_params(self) -> list:
        return [p for g in self.param_groups for p in g["params"]]

    @no_grad()
    def state_dict(self) -> dict:
        """The state one process's optimizer would have (per original parameter, full tensors),
        gathered from every rank's shard: collective over the DP group."""
        index = {id(p): i for i, p in enumerate(self._original_params())}
        inner = self.optimizer.state_dict()["state"] if self.optimizer is not None else {}
        mine_of = {id(shard): inner.get(k, {}) for k, shard in enumerate(self._inner_params())}
        keys, step = set(), 0
        for st in inner.values():
            keys |= {k for k, v in st.items() if hasattr(v, "numel") and v.ndim == 1}
            step = max(step, int(st.get("step", 0)))
        t = from_numpy(np.array([step], dtype=np.int64)).to(self.buckets[0].device)
        self.group.all_reduce(t, ReduceOp.MAX)
        step = int(t.item())
        keys = sorted(keys) if keys else ["exp_avg", "exp_avg_sq"]
        state = {}
        for bi, b in enumerate(self.buckets):
            for key in keys:
                mine = zeros(b.piece, dtype=b.dtype, device=b.device)
                for shard, sbi, at, p, _ in self.segments:
                    if sbi == bi and key in mine_of[id(shard)]:
                        mine[at:at + shard.numel()].copy_(mine_of[id(shard)][key])
                full = empty(b.padded, dtype=b.dtype, device=b.device)
                self.group.all_gather(full, mine)
                for j, p in enumerate(b.params):
                    entry = state.setdefault(index[id(p)], {"step": step})
                    entry[key] = full[b.offsets[j]:b.offsets[j] + p.numel()].view(*p.shape).clone()
        groups, at = [], 0
        for g in self.param_groups:
            groups.append({**{k: v for k, v in g.items() if k != "params"},
                           "params": list(range(at, at + len(g["params"])))})
            at += len(g["params"])
        return {"state": state if step > 0 else {}, "param_groups": groups}

    def _inner_params(self) -> list:
        """The shard parameters in the order of the inner optimizer's state_dict."""
        return [p for g in self.optimizer.param_groups for p in g["params"]] if self.optimizer is not None else []

    @no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        """Takes one process's optimizer state (what state_dict gives, from any DP size or
        none): each rank keeps its shard of every tensor."""
        params = self._original_params()
        groups = state_dict["param_groups"]
        for saved in groups:
            self.optimizer_class.check_hyperparameters({k: v for k, v in saved.items() if k != "params"})
        for i, st in state_dict["state"].items():
            self.optimizer_class.check_state(i, st)
        if len(groups) != len(self.param_groups):
            raise ValueError(f"optimizer state has {len(groups)} parameter groups, this optimizer "
                             f"has {len(self.param_groups)}")
        for saved, own in zip(groups, self.param_groups):
            own.update({k: v for k, v in saved.items() if k != "params"})
        index = {id(p): i for i, p in enumerate(params)}
        inner = {}  # shard parameter -> its piece of the state
        for shard, _, _, p, off in self.segments:
            st = state_dict["state"].get(index[id(p)], state_dict["state"].get(str(index[id(p)])))
            if not st:
                continue
            entry = {}
            for k, v in st.items():
                if hasattr(v, "numel") and tuple(v.shape) == tuple(p.shape):
                    entry[k] = v.contiguous().view(-1)[off:off + shard.numel()].clone()
                elif hasattr(v, "numel") and v.numel() > 1:
                    raise ValueError(f"optimizer state '{k}' has shape {tuple(v.shape)}, its parameter "
                                     f"{tuple(p.shape)}")
                else:
                    entry[k] = v.item() if hasattr(v, "item") else v
            inner[shard] = entry
        if self.optimizer is not None:
            self.optimizer.load_state_dict({"state": {k: inner[shard] for k, shard in enumerate(self._inner_params())
                                                      if shard in inner},
                                            "param_groups": self.optimizer.numbered_groups()})

    def __repr__(self) -> str:
        n = sum(seg[0].numel() for seg in self.segments)
        return (f"ZeroOptimizer(stage {self.stage}, rank {self.rank} of {self.world}, "
                f"{len(self.buckets)} buckets, {n} elements of optimizer state here)")
