"""Adadelta, RMSprop and Adagrad against torch.optim's, step by step from the same parameters and
gradients (two parameter groups with different settings), and their state_dict round trip."""
import numpy as np
import pytest

import infinitrain as it
from infinitrain import optim

torch = pytest.importorskip("torch")

CASES = [
    ("Adadelta", dict(lr=0.5), dict(rho=0.8, weight_decay=0.1, maximize=True)),
    ("RMSprop", dict(lr=0.01), dict(alpha=0.9, momentum=0.5, centered=True, weight_decay=0.05)),
    ("RMSprop", dict(lr=0.02, momentum=0.9), dict(eps=1e-6)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.05), dict(initial_accumulator_value=0.3, weight_decay=0.1)),
]


def _run(lib, cls, defaults, second, shapes, grads, steps, state=None):
    ps = [lib.tensor(np.linspace(-1, 1, int(np.prod(s)), dtype=np.float32).reshape(s), requires_grad=True)
          for s in shapes]
    opt = getattr(lib.optim, cls)([{"params": ps[:1]}, {"params": ps[1:], **second}], **defaults)
    if state is not None:
        opt.load_state_dict(state)
    for k in steps:
        for p, g in zip(ps, grads[k]):
            p.grad = lib.tensor(g)
        opt.step()
    return [p.detach().numpy().copy() for p in ps], opt


@pytest.mark.parametrize("cls,defaults,second", CASES)
def test_optimizer_steps_equal_pytorchs(cls, defaults, second, rng):
    shapes = [(3, 4), (5,)]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(5)]
    ours, opt = _run(it, cls, defaults, second, shapes, grads, range(5))
    theirs, topt = _run(torch, cls, defaults, second, shapes, grads, range(5))
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.state_dict()["param_groups"]] == \
        [{k: v for k, v in g.items() if k != "params"} for g in topt.state_dict()["param_groups"]]
    # stopped after two steps, saved, loaded into a fresh optimizer, and continued: the same end
    _, half = _run(it, cls, defaults, second, shapes, grads, range(2))
    saved = half.state_dict()
    half_params = [p.detach().numpy().copy() for g in half.param_groups for p in g["params"]]
    ps = [it.tensor(a, requires_grad=True) for a in half_params]
    fresh = getattr(optim, cls)([{"params": ps[:1]}, {"params": ps[1:], **second}], **defaults)
    fresh.load_state_dict(saved)
    for k in range(2, 5):
        for p, g in zip(ps, grads[k]):
            p.grad = it.tensor(g)
        fresh.step()
    for a, p in zip(ours, ps):
        np.testing.assert_allclose(p.detach().numpy(), a, rtol=1e-6, atol=1e-7)


def test_bad_settings_are_refused_clearly():
    p = [it.zeros(2, requires_grad=True)]
    with pytest.raises(ValueError, match="rho"):
        optim.Adadelta(p, rho=1.5)
    with pytest.raises(ValueError, match="momentum"):
        optim.RMSprop(p, momentum=-1)
    with pytest.raises(ValueError, match="lr_decay"):
        optim.Adagrad(p, lr_decay=-0.1)
    with pytest.raises(NotImplementedError, match="differentiable"):
        optim.RMSprop(p, differentiable=True)
