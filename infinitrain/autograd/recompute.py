"""Activation recomputation (PyTorch's torch.utils.checkpoint): run a piece of the model
without keeping what its backward would need, keep only its inputs, and run it again inside
backward to get those. Memory falls by the piece's activations; compute rises by one forward
of the piece.

The replay sees what the first run saw: the same autocast dtype and the same random numbers
(the default generator is put back to where it stood, then restored), so the recomputed
activations, and hence the gradients, are bit-identical to a run without recomputation.
"""
from __future__ import annotations

from .. import amp
from ..random import default_generator
from ..tensor import Tensor
from .engine import grad, split_grad
from .function import Function
from .grad_mode import enable_grad

_replaying = [0]  # depth of the replays running now (one per nested checkpoint)


def is_recomputing() -> bool:
    """True while a checkpointed piece reruns in backward: code that records something once per
    forward (a router's load counts) skips the rerun, or it would count the piece twice."""
    return _replaying[0] > 0


class _Recompute(Function):
    @staticmethod
    def forward(ctx, fn, n_args, *inputs):
        # inputs: fn's arguments, then the parameters fn trains. Through them the node is
        # recorded even when no argument needs a gradient (LoRA: a frozen embedding feeds a
        # block whose adapters train), and the parameters' gradients leave the replay through
        # this node's edges: a parameter also used outside the piece then gets one sum,
        # accumulated once, and its post-accumulate hooks (DDP's bucket counts) fire once
        ctx.fn, ctx.args, ctx.params = fn, inputs[:n_args], inputs[n_args:]
        ctx.weight_inputs = tuple(range(2 + n_args, 2 + len(inputs)))  # defer_weight_grads: the params wait
        ctx.autocast, ctx.rng = amp.autocast_dtype(), default_generator.get_state()
        return fn(*ctx.args)  # Function.apply runs this without recording

    @staticmethod
    def backward(ctx, *grads):
        inputs = [a.detach().requires_grad_(a.requires_grad) if isinstance(a, Tensor) else a
                  for a in ctx.args]
        rng_now = default_generator.get_state()
        default_generator.set_state(ctx.rng)
        _replaying[0] += 1
        try:
            with enable_grad(), amp.dtype_set(ctx.autocast):
                out = ctx.fn(*inputs)
        finally:
            _replaying[0] -= 1
            default_generator.set_state(rng_now)
        outs = out if isinstance(out, tuple) else (out,)
        pairs = [(o, g) for o, g in zip(outs, grads) if isinstance(o, Tensor) and o.requires_grad]
        wanted = [a for a in inputs if isinstance(a, Tensor) and a.requires_grad] + list(ctx.params)
        found = iter(())
        weights_later = ctx.params and not any(ctx.needs_input_grad[2 + len(ctx.args):])
        if pairs and weights_later:  # a deferred backward's input part: the replay's W runs in the outer W
            takes = [a for a in inputs if isinstance(a, Tensor) and a.requires_grad]
            found, ctx.finish_weights = split_grad([o for o, _ in pairs], takes, ctx.params, [g for _, g in pairs])
            found = iter(list(found) + [None] * len(ctx.params))
        elif pairs and wanted:  # a nested pass: its end-of-backward callbacks wait for the outer one's end
            found = iter(grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True,
                              accumulate_others=True))
        in_grads = [next(found, None) if isinstance(a, Tensor) and a.requires_grad else None for a in inputs]
        return (None, None, *in_grads, *(next(found, None) for _ in ctx.params))

    @staticmethod
    def backward_weight(ctx, *grads):
        weights = ctx.finish_weights() if hasattr(ctx, "finish_weights") else [None] * len(ctx.params)
        return (None, None, *(None for _ in ctx.args), *weights)


def checkpoint(fn, *args):
    """fn(*args), recomputed in backward instead of keeping its activations. fn's parameters
    get their gradients as usual (hooks included); inputs that are tensors get theirs. fn is
    a module, a method of one, or a function (whose parameters, if it uses any, should then
    reach it through args: others get their gradient in an accumulation of its own, apart
    from any use outside the piece)."""
    owner = getattr(fn, "__self__", fn)  # a bound method's module
    parameters = getattr(owner, "parameters", None)
    trained = [p for p in parameters() if p.requires_grad] if callable(parameters) else []
    return _Recompute.apply(fn, len(args), *args, *trained)
