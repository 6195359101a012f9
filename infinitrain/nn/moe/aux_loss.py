"""The routers' auxiliary losses, and how they reach the gradients without touching the loss
that the model returns (Megatron's MoEAuxLossAutoScaler): the layer's output passes through an
autograd function that, in backward, also starts the auxiliary loss's backward with the
gradient the language-model loss's own backward starts with. So the losses need not travel to
the last pipeline stage, recomputation reruns them with their layer, and the logged loss stays
the language-model loss.

That starting gradient is 1 / (the step's micro-batches): TrainStep, the pipeline and the
DeepSpeed engine set it (`aux_loss_scale`) around their backward passes, as finalize.scale_loss
divides each micro-batch's loss. Combined with the data-parallel average, the auxiliary loss
is then the mean over the global batch's sequences, as the language-model loss is its mean
over their tokens. A loop of one's own that accumulates M micro-batches and divides each loss
by M runs its backward passes inside `aux_loss_scale(1 / M)` likewise. (A fp16 GradScaler's
factor is not applied to the auxiliary losses: train MoE models in bf16.)

Both losses are defined per sequence (DeepSeek-V3's sequence-wise form) and averaged over the
micro-batch's sequences, so splitting a batch over data-parallel ranks or micro-batches does
not change them:
- load balancing (Switch / GShard): E * sum_e f_e * P_e, with f_e = (assignments of the
  sequence's tokens to e) / (k * T), P_e = mean over the sequence's tokens of e's probability;
- z-loss (ST-MoE): mean over the sequence's tokens of logsumexp(logits)^2.
"""
from __future__ import annotations

from contextlib import contextmanager

from ...autograd import Function
from ...tensor import Tensor

_scale = [1.0]


@contextmanager
def aux_loss_scale(scale: float):
    """Inside, the auxiliary losses' backward starts from `scale` (the step's 1 / micro-batches)."""
    previous = _scale[0]
    _scale[0] = float(scale)
    try:
        yield
    finally:
        _scale[0] = previous


class MoEAuxLossAutoScaler(Function):
    """forward(output, aux_loss) -> output; backward: output's gradient as it is, and the
    scalar aux_loss's gradient the current scale (times `factor`: the context-parallel size,
    see layer.MoE)."""

    @staticmethod
    def forward(ctx, output: Tensor, aux_loss: Tensor, factor: float):
        ctx.save_for_backward(aux_loss)
        ctx.scale = _scale[0] * factor
        return output.view_as(output)

    @staticmethod
    def backward(ctx, g):
        aux_loss, = ctx.saved_tensors
        return g, aux_loss.detach() * 0 + ctx.scale, None


def attach_aux_loss(output: Tensor, aux_loss: Tensor, factor: float = 1.0) -> Tensor:
    """output, with aux_loss's gradient injected in backward (see the module's docstring)."""
    return MoEAuxLossAutoScaler.apply(output, aux_loss, factor)
