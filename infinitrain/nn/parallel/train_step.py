"""One training step of a parallel job, whatever its layout, used by the examples' trainer and
by the multi-process tests alike. The ParallelPlan says which wrappers compose
(`data_parallel_wrapper`); TrainStep builds them:
- ZeRO (zero_stage >= 1 on more than one DP rank) replaces DDP: its reduce-scatter averages the
  gradients over DP and it shards the optimizer (stage 1), the gradients (2), the parameters
  (3). Under pipeline parallelism (stages 1 and 2) the pipeline runs without reducers of its own.
- Pipeline parallelism: PipelineParallel runs the schedule over the step's micro-batches, with
  one DDP Reducer per model chunk over DP unless ZeRO reduces.
- Otherwise, DP > 1: DistributedDataParallel, micro-batches accumulated under no_sync but the last.
Then, once per step: finalize_grads (every gradient fix-up), the one-process gradient norm and
clipping, the optimizer step, zero_grad.
"""
from __future__ import annotations

from contextlib import nullcontext

from ...creation import tensor
from ...dtypes import float32
from ...optim.offload import OffloadOptimizer, offloaded
from ...profiler import record_function
from ..moe import aux_loss_scale
from ..utils import clip_coef, clip_grad_norm_
from .ddp import DistributedDataParallel, _MixedPrecision
from .finalize import changed_after_reduction, finalize_grads, scale_loss
from .pp import PipelineParallel
from .process_group import ReduceOp
from .zero import ZeroOptimizer


def decay_groups(model, weight_decay: float) -> list:
    """Parameter groups as GPT-2/LLaMA trainers make them: weight decay on matrices and
    embeddings, none on biases and norm weights; trainable parameters only."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


class TrainStep:
    """model: built for this rank's layout (with the plan's tensor_parallel(), pipeline_stage()
    and context_parallel()). plan: the job's ParallelPlan, which says what wraps the model and
    the optimizer (DDP, a pipeline with a Reducer per chunk, ZeRO), over which group gradients
    are reduced, and where the optimizer state lives. The optimizer is
    optimizer_class(param_groups, **optimizer_kwargs), sharded by ZeRO, its state (each rank's
    shard of it) in host memory or on disk (OffloadOptimizer) as the plan's offload options say."""

    def __init__(self, model, plan, param_groups, optimizer_class, pipeline_timeout: float = 300.0,
                 bucket_cap_mb: float = 25.0, set_to_none: bool = True, grad_reduce_dtype=None, **optimizer_kwargs):
        self.model, self.plan = model, plan
        wrapper = plan.data_parallel_wrapper
        # the group that reduces gradients and means the loss (DP x CP), when there is one
        self.dp_group = plan.gradient_group if wrapper is not None else None
        self.pp_group = plan.pipeline_group if plan.pipelined else None
        self.dp = plan.dp_cp
        self.zero = wrapper == "zero"
        # under expert parallelism, the experts' gradients are reduced over the ranks holding them
        self.expert_group = plan.expert_gradient_group if wrapper is not None and plan.ep > 1 else None
        self.pipe = PipelineParallel(model, plan.pipeline_schedule, self.dp_group if wrapper == "pipeline" else None,
                                     pipeline_timeout, expert_group=self.expert_group) if plan.pipelined else None
        # the models' buffers are constants (rope tables, positions), the same on every rank from
        # the start: broadcasting them before every forward (PyTorch's default) is bytes for nothing
        # grad_reduce_dtype: the dtype DDP averages gradients in (None: theirs)
        self.net = DistributedDataParallel(model, process_group=self.dp_group, broadcast_buffers=False,
                                           mixed_precision=_MixedPrecision(reduce_dtype=grad_reduce_dtype),
                                           expert_process_group=self.expert_group) if wrapper == "ddp" else model
        if self.zero:
            self.optimizer = ZeroOptimizer(param_groups, optimizer_class, self.dp_group, stage=plan.zero_stage,
                                           bucket_cap_mb=bucket_cap_mb, module=model,
                                           offload_optimizer=plan.offload_optimizer, offload_path=plan.offload_path,
                                           offload_param=plan.offload_param, expert_group=self.expert_group,
                                           **optimizer_kwargs)
        else:
            self.optimizer = offloaded(optimizer_class(param_groups, **optimizer_kwargs), plan.offload_optimizer,
                                       plan.offload_path)
        self.set_to_none = set_to_none
        # the OffloadOptimizer the gradients stream to during backward, or None; set it to None
        # to have them copied when the step runs instead (the same bits, no overlap)
        self.streaming = self._stream_gradients()

    @property
    def data_parallel(self) -> list:
        """What reduces gradients over DP x CP during backward and finishes in finalize_grads:
        DDP's reducer, or the pipeline's per-chunk reducers (ZeRO: the optimizer, apart)."""
        if self.pipe is not None:
            return list(self.pipe.reducers)
        return [self.net.reducer] if self.net is not self.model else []

    def _stream_gradients(self):
        """With the optimizer's state offloaded from a GPU, each gradient goes to the host as
        soon as it is final in the step's last backward (ZeRO-Offload's schedule): DDP's
        reducer hands over each bucket as its all-reduce is queued, ZeRO each bucket as its
        reduce-scatter lands, and on one rank each parameter's own hook as its gradient is
        accumulated; under a pipeline each chunk's reducer, which reduces only after that
        chunk's last backward. Returns the OffloadOptimizer that streams, or None: no offload,
        the CPU, or a pipeline without DDP's reducers (on one DP rank, or under ZeRO), where a
        gradient is known final only when the whole schedule has run."""
        off = self.offloaded
        if off is None or not off.streams_gradients:
            return None
        if self.pipe is not None:
            if not self.pipe.reducers:
                return None
            for reducer in self.pipe.reducers:
                reducer.on_reduced = off.grads_ready
        elif self.zero:
            self.optimizer.on_reduced = off.grads_ready
        elif self.net is not self.model:
            self.net.reducer.on_reduced = off.grads_ready
        else:
            for p in off.params:
                p.register_post_accumulate_grad_hook(lambda p: off.grads_ready((p,)))
        return off

    @property
    def offloaded(self):
        """The OffloadOptimizer that keeps this rank's optimizer state, or None."""
        inner = self.optimizer.optimizer if self.zero else self.optimizer
        return inner if isinstance(inner, OffloadOptimizer) else None

    def step(self, micro_batches, forward_context=None, grad_clip: float = 0.0) -> tuple:
        """forward_backward, then optimizer_step: (the step's loss, the gradient norm)."""
        loss = self.forward_backward(micro_batches, forward_context, step_during_backward=grad_clip == 0)
        return loss, self.optimizer_step(grad_clip)

    def forward_backward(self, micro_batches, forward_context=None, step_during_backward: bool = False) -> float:
        """Forward and backward of the step's micro-batches [(idx, targets)] (this DP rank's);
        the gradients are their mean. Returns the mean loss over them and over DP.
        step_during_backward: the caller's optimizer_step will not clip, so with the optimizer's
        state offloaded to host memory from a GPU, on one data-parallel rank, the host may update
        each parameter while the last backward goes on (OffloadOptimizer.arm); the same bits."""
        # the MoE layers' auxiliary losses start their backward as the loss does (nn.moe.aux_loss)
        with aux_loss_scale(1.0 / len(micro_batches)):
            return self._forward_backward(micro_batches, forward_context, step_during_backward)

    def _forward_backward(self, micro_batches, forward_context, step_during_backward: bool = False) -> float:
        context = forward_context or nullcontext
        if self.pipe is not None:
            if self.streaming is not None:  # the chunks' reducers hand over only after their last backward
                self.streaming.arm()
            with record_function("pipeline forward_backward"):
                loss = self.pipe.forward_backward(micro_batches, context)
        else:
            M = len(micro_batches)
            loss_sum = None  # summed where the loss is: on a GPU the host does not wait per micro-batch
            for m, (x, y) in enumerate(micro_batches):
                sync = m == M - 1 or self.net is self.model
                if m == M - 1 and self.streaming is not None:
                    # on one DP rank each gradient is handed over once, by its own hook
                    early = step_during_backward and self.net is self.model and not self.zero
                    self.streaming.arm(update=early, hold=changed_after_reduction(self.model) if early else ())
                with (nullcontext() if sync else self.net.no_sync()):
                    with context(), record_function("forward"):
                        _, part = self.net(x, y, return_logits=False)
                    with record_function("backward"):
                        scale_loss(part, M).backward()
                part = part.detach().double()
                loss_sum = part if loss_sum is None else loss_sum + part
            loss = loss_sum.item() / M
        return self.dp_mean(loss)

    def optimizer_step(self, grad_clip: float = 0.0):
        """finalize_grads, the norm (clipped to grad_clip when it is > 0), the optimizer's step
        and zero_grad. Returns the norm before clipping, or None without clipping."""
        with record_function("optimizer step"):
            if self.streaming is not None:  # what finalize_grads changes is copied again
                self.streaming.grads_changed(changed_after_reduction(self.model))
            finalize_grads(self.model, self.data_parallel, self.optimizer if self.zero else None)
            norm = self.clip_grad_norm_(grad_clip) if grad_clip > 0 else None
            if norm is not None and self.streaming is not None and (coef := clip_coef(grad_clip, norm)) is not None:
                self.streaming.grads_scaled(coef)  # the streamed copies follow the clipping
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=self.set_to_none)
        return norm

    def clip_grad_norm_(self, max_norm: float) -> float:
        """The one-process norm of every rank's gradients (ZeRO: of its shards), clipped."""
        if self.zero:
            return self.optimizer.clip_grad_norm_(max_norm, pipeline_group=self.pp_group)
        return clip_grad_norm_(self.model.parameters(), max_norm, pipeline_group=self.pp_group,
                               expert_group=self.plan.expert_group)

    def dp_mean(self, value: float) -> float:
        """The mean of a per-rank number over the data-parallel ranks."""
        if self.dp == 1:
            return value
        device = next(iter(self.model.parameters())).device
        t = tensor([value], dtype=float32, device=device)
        self.dp_group.all_reduce(t, ReduceOp.AVG)
        return t.item()

    def gathered_parameters(self):
        """A context in which every parameter is whole (ZeRO-3 gathers them)."""
        return self.optimizer.gathered_parameters() if self.zero else nullcontext()
