"""PyTorch API a port needs at once (issue 28's list, a first slice), held against PyTorch:
nn.Softmax and nn.MSELoss, clip_grad_value_, the fan-based initialisers (their bounds and
spread) and trunc_normal_, and the step/multi-step/exponential schedules."""
import math

import numpy as np
import pytest

import infinitrain as it
from infinitrain import nn
from infinitrain.optim import SGD, lr_scheduler

torch = pytest.importorskip("torch")


def test_softmax_and_mse_loss_modules_equal_pytorchs(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    y = rng.standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(nn.Softmax(dim=1)(it.tensor(x)).numpy(),
                               torch.nn.Softmax(dim=1)(torch.tensor(x)).numpy(), rtol=1e-6)
    for reduction in ("mean", "sum", "none"):
        np.testing.assert_allclose(nn.MSELoss(reduction=reduction)(it.tensor(x), it.tensor(y)).numpy(),
                                   torch.nn.MSELoss(reduction=reduction)(torch.tensor(x), torch.tensor(y)).numpy(),
                                   rtol=1e-6)
    with pytest.raises(ValueError, match="give dim"):
        nn.Softmax()


def test_clip_grad_value_clamps_every_gradient_as_pytorch(rng):
    g = rng.standard_normal((4, 4)).astype(np.float32) * 3
    ours, theirs = it.zeros(4, 4, requires_grad=True), torch.zeros(4, 4, requires_grad=True)
    ours.grad, theirs.grad = it.tensor(g), torch.tensor(g)
    nn.utils.clip_grad_value_([ours], 1.5)
    torch.nn.utils.clip_grad_value_([theirs], 1.5)
    np.testing.assert_array_equal(ours.grad.numpy(), theirs.grad.numpy())


@pytest.mark.parametrize("init,kwargs,bound,std", [
    ("xavier_uniform_", {}, math.sqrt(6 / (64 + 256)), None),
    ("xavier_normal_", {"gain": 2.0}, None, 2 * math.sqrt(2 / (64 + 256))),
    ("kaiming_uniform_", {"a": math.sqrt(5)}, 1 / 8, None),  # PyTorch's Linear default: 1/sqrt(fan_in)
    ("kaiming_normal_", {"mode": "fan_out", "nonlinearity": "relu"}, None, math.sqrt(2) / 16),
])
def test_fan_based_initialisers_draw_what_pytorch_draws(init, kwargs, bound, std):
    """A weight [256, 64]: fan_in 64, fan_out 256. Bounds exact, spread against PyTorch's draw."""
    w = it.empty(256, 64)
    getattr(nn.init, init)(w, **kwargs)
    t = torch.empty(256, 64)
    getattr(torch.nn.init, init)(t, **kwargs)
    a, b = w.numpy(), t.numpy()
    if bound is not None:
        assert np.abs(a).max() <= bound * (1 + 1e-6) and np.abs(a).max() > 0.95 * bound
    np.testing.assert_allclose(a.std(), b.std(), rtol=0.05)
    assert nn.init.calculate_gain("leaky_relu", 0.2) == pytest.approx(torch.nn.init.calculate_gain("leaky_relu", 0.2))


def test_trunc_normal_stays_in_its_interval_with_the_truncated_spread():
    w = it.empty(200, 200)
    nn.init.trunc_normal_(w, mean=0.5, std=1.0, a=-1.0, b=2.0)
    a = w.numpy()
    t = torch.nn.init.trunc_normal_(torch.empty(200, 200), mean=0.5, std=1.0, a=-1.0, b=2.0).numpy()
    assert a.min() >= -1.0 and a.max() <= 2.0
    np.testing.assert_allclose([a.mean(), a.std()], [t.mean(), t.std()], atol=0.02)


def _learning_rates(ours, theirs, steps: int) -> tuple:
    """The rates our schedule and PyTorch's give an SGD optimizer over `steps` steps."""
    mine = SGD([it.zeros(2, requires_grad=True)], lr=0.1)
    ref = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    a, b = ours(mine), theirs(ref)
    got, want = [], []
    for _ in range(steps):
        got.append(mine.param_groups[0]["lr"])
        want.append(ref.param_groups[0]["lr"])
        ref.step()
        a.step()
        b.step()
    return got, want


@pytest.mark.parametrize("ours,theirs", [
    (lambda o: lr_scheduler.StepLR(o, 3, 0.5), lambda o: torch.optim.lr_scheduler.StepLR(o, 3, 0.5)),
    (lambda o: lr_scheduler.MultiStepLR(o, [2, 5], 0.1),
     lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [2, 5], 0.1)),
    (lambda o: lr_scheduler.ExponentialLR(o, 0.9), lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.9)),
], ids=["StepLR", "MultiStepLR", "ExponentialLR"])
def test_step_schedules_give_pytorchs_learning_rates(ours, theirs):
    np.testing.assert_allclose(*_learning_rates(ours, theirs, 8), rtol=1e-12)


@pytest.mark.parametrize("build", ["warmup_cosine", "step_then_exponential"])
def test_sequential_schedules_give_pytorchs_learning_rates(build):
    def make(mod, opt):
        if build == "warmup_cosine":
            return mod.SequentialLR(opt, [mod.LinearLR(opt, start_factor=0.1, total_iters=3),
                                          mod.CosineAnnealingLR(opt, T_max=6)], milestones=[3])
        return mod.SequentialLR(opt, [mod.StepLR(opt, 2, 0.5), mod.ExponentialLR(opt, 0.8)], milestones=[4])
    got, want = _learning_rates(lambda o: make(lr_scheduler, o), lambda o: make(torch.optim.lr_scheduler, o), 12)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind,kw", [("SGD", dict(pct_start=0.3)), ("AdamW", dict(anneal_strategy="linear")),
                                     ("AdamW", dict(three_phase=True, pct_start=0.25)),
                                     ("SGD", dict(epochs=2, steps_per_epoch=10, cycle_momentum=False))])
def test_one_cycle_lr_follows_pytorchs_learning_rate_and_momentum(kind, kw):
    ours_p, theirs_p = it.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    opt_kw = dict(lr=0.1, momentum=0.9) if kind == "SGD" else dict(lr=0.1)
    ours_opt = getattr(it.optim, kind)([ours_p], **opt_kw)
    theirs_opt = getattr(torch.optim, kind)([theirs_p], **opt_kw)
    steps = {} if "epochs" in kw else {"total_steps": 20}
    ours = lr_scheduler.OneCycleLR(ours_opt, max_lr=0.5, **steps, **kw)
    theirs = torch.optim.lr_scheduler.OneCycleLR(theirs_opt, max_lr=0.5, **steps, **kw)
    key = "momentum" if kind == "SGD" else "betas"
    for _ in range(20):
        g, t = ours_opt.param_groups[0], theirs_opt.param_groups[0]
        assert g["lr"] == pytest.approx(t["lr"], rel=1e-12)
        if key == "momentum" or kw.get("cycle_momentum", True):
            assert np.allclose(np.ravel(g[key])[:1], np.ravel(t[key])[:1], rtol=1e-12)
        ours_opt.step(), theirs_opt.step()
        ours.step(), theirs.step()
    with pytest.raises(ValueError, match="total_steps"):
        ours.step()
