"""A parameter that several modules hold (GPT-2's token embedding, tied to its output head) gets
one gradient contribution per use: the head's at the start of backward, the embedding's at its
end. Left to autograd, the first waits whole through the whole backward pass until the last
arrives, and their sum is a third tensor of the same size (on GPT-2 124M three 154 MB tensors at
the end of backward, a fifth of what ZeRO-2 promises to hold). Here each use of such a
parameter reads it through an identity (`_SharedUse`) whose backward hands that use's
gradient to ZeRO at once, and nothing reaches the parameter itself: stage 1 adds it into the
flat gradient in place, stages 2 and 3 reduce-scatter it into this rank's shard right away
(each contribution is averaged over DP on its own; their sum is the same), and stage 3 frees
the gathered weights as soon as that use's backward is done. This is how the issue's "the
head's share during backward, the embedding's at the end" is done without the model knowing.

The swap: a forward pre-hook on every module that holds a shared parameter puts the identity's
output in the module's place for the duration of its forward (a forward hook puts the parameter
back), so the module's code reads it as it reads any weight.
"""
from __future__ import annotations

from ....autograd import Function, is_grad_enabled


class _SharedUse(Function):
    """The parameter itself in forward (the same memory); in backward, this use's gradient goes
    to ZeRO (`on_grad(parameter, gradient)`) and none to the parameter."""

    @staticmethod
    def forward(ctx, weight, on_grad):
        ctx.weight, ctx.on_grad = weight, on_grad
        return weight

    @staticmethod
    def backward(ctx, grad):
        ctx.on_grad(ctx.weight, grad)
        return None, None


def shared_parameters(module, params) -> list:
    """The parameters of `params` that more than one place of `module` holds (a module's own
    parameters counted by name), each once, in `params`' order."""
    count = {}
    for m in module.modules():
        for q in m._parameters.values():
            if q is not None:
                count[id(q)] = count.get(id(q), 0) + 1
    return [p for p in params if count.get(id(p), 0) > 1]


class SharedUses:
    """Installs the identity in front of every use of `params` in `module`: on_grad(parameter,
    gradient) is called once per use in every backward pass."""

    def __init__(self, module, params, on_grad):
        self.on_grad = on_grad
        ids = {id(p) for p in params}
        self.holders = []  # (module, the names of its shared parameters, the parameters)
        for m in module.modules():
            names = [n for n, q in m._parameters.items() if q is not None and id(q) in ids]
            if names:
                self.holders.append((m, names, [m._parameters[n] for n in names]))
        self.handles = []
        for m, names, originals in self.holders:
            self.handles.append(m.register_forward_pre_hook(self._swap_in(names, originals)))
            self.handles.append(m.register_forward_hook(self._swap_back(names, originals)))

    def _swap_in(self, names, originals):
        def hook(m, args):
            for name, p in zip(names, originals):  # (from the originals: a forward that raised left no alias)
                m._parameters[name] = _SharedUse.apply(p, self.on_grad) if is_grad_enabled() else p
        return hook

    @staticmethod
    def _swap_back(names, originals):
        def hook(m, args, output):
            for name, p in zip(names, originals):
                m._parameters[name] = p
        return hook
