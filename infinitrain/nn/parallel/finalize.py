"""After the last backward of a step, before the norm and the optimizer: every gradient fix-up
a parallel layout needs, in one place (Megatron's finalize_model_grads). Each makes a layout's
gradients the ones one process would have:

- data parallelism: the replicas' gradients averaged. DDP's buckets are reduced during
  backward and waited for at its end; ZeRO reduce-scatters its buckets (stage 2 and 3 during
  backward, stage 1 here) into the shards the optimizer steps;
- tied parameters a pipeline holds twice (GPT-2's token embedding on the first stage and its
  output head on the last): their gradients summed over the first and last stage;
- partial gradients: a replicated parameter that saw only part of the work on each rank of a
  group (under sequence parallelism the norms, row-parallel biases and position embeddings saw
  their rank's part of the sequence; a LoRA adapter's whole half saw its rank's part of the
  layer) is marked `param.partial_grad_group`, and its gradient is summed over that group.
"""
from __future__ import annotations

from ...autograd import no_grad
from ...kernels.memory import cat
from .process_group import ReduceOp


@no_grad()
def reduce_partial_grads(params) -> None:
    """Sums over its partial_grad_group the gradient of every parameter marked with one (one
    all-reduce per group, in float32). ZeRO calls it on each gradient as it lands, before the
    full gradient is dropped; everything else once per step, through finalize_grads."""
    by_group = {}
    for p in params:
        group = getattr(p, "partial_grad_group", None)
        if group is not None and p.grad is not None:
            by_group.setdefault(id(group), (group, []))[1].append(p)
    for group, ps in by_group.values():
        flat = cat([p.grad.reshape(-1).float() for p in ps])
        group.all_reduce(flat, ReduceOp.SUM)
        at = 0
        for p in ps:
            n = p.numel()
            p.grad.copy_(flat[at:at + n].reshape(*p.shape))
            at += n


def _tied_group(model):
    """The group of the first and last pipeline stage, which both hold the model's tied
    parameters, or None (no pipeline, or nothing tied across it)."""
    stage = getattr(model, "pp", None)
    return stage.embedding_group if stage is not None else None


def changed_after_reduction(model) -> list:
    """The parameters whose gradients finalize_grads still changes after data parallelism
    reduced them: the tied ones a pipeline holds twice and those marked partial_grad_group.
    (A copy of a gradient taken when its reduction is done, such as OffloadOptimizer's, must be
    taken again for these.)"""
    tied = list(model.tied_parameters()) if _tied_group(model) is not None else []
    return tied + [p for p in model.parameters() if getattr(p, "partial_grad_group", None) is not None]


@no_grad()
def sum_tied_grads(model, zero=None) -> None:
    """Sums the gradients of the parameters the model ties and a pipeline holds twice over the
    first and last stage: their full gradients, or where ZeRO-2 dropped those, its shards."""
    group = _tied_group(model)
    if group is None:
        return
    grads = [p.grad for p in model.tied_parameters() if p.grad is not None]
    shards = zero.tied_grad_shards() if zero is not None else []
    for g in grads + shards:
        group.all_reduce(g, ReduceOp.SUM)


def scale_loss(loss, num_micro_batches: int):
    """A micro-batch's loss as backward takes it: divided by the step's micro-batches, so that
    the accumulated gradients are their mean, as one process's batch gives (Megatron's
    forward_step_calc_loss). TrainStep and the pipeline both scale through here."""
    return loss / num_micro_batches if num_micro_batches > 1 else loss


@no_grad()
def finalize_grads(model, data_parallel=(), zero=None) -> None:
    """Every gradient fix-up after the step's last backward (see the module's docstring), in
    this order:
    1. data_parallel (DDP's reducer, or a pipeline's per-chunk reducers): each finish_grad_sync()
       launches what backward left and waits, so the full gradients are averaged over DP x CP
       (normally done already: backward's end finishes them, as PyTorch's DDP does);
    2. the tied sum over the pipeline's first and last stage (full gradients, or ZeRO-2's shards);
    3. the partial sums over their groups (ZeRO-2/3 summed theirs as each gradient landed);
    4. zero (a ZeroOptimizer, or None): finish_grad_sync() reduce-scatters what is still whole
       (stage 1's fixed-up full gradients) into this rank's shards."""
    for reducer in data_parallel:
        reducer.finish_grad_sync()
    sum_tied_grads(model, zero)
    reduce_partial_grads(model.parameters())
    if zero is not None:
        zero.finish_grad_sync()
