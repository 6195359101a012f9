"""amp.GradScaler against torch.amp.GradScaler (on the CPU, where both run): the scaled loss,
the unscaled gradients and parameters after each step, skipped steps on inf/NaN, backoff and
growth of the scale, state_dict; and autocast's PyTorch signature."""
import numpy as np
import pytest

import infinitrain as it

torch = pytest.importorskip("torch")


def _train(lib, grads_scale, steps, scaler_kwargs, rng_seed=0):
    rng = np.random.default_rng(rng_seed)
    w0 = rng.standard_normal((3, 4)).astype(np.float32)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    w = lib.tensor(w0, requires_grad=True)
    opt = lib.optim.SGD([w], lr=0.1, momentum=0.9)
    scaler = lib.amp.GradScaler("cpu", **scaler_kwargs)
    scales, weights = [], []
    for k in range(steps):
        opt.zero_grad()
        loss = ((lib.tensor(x) @ w.t()) ** 2).mean() * grads_scale[k]
        scaler.scale(loss).backward()
        if k % 2:
            scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        weights.append(w.detach().numpy().copy())
    return scales, weights, scaler.state_dict(), w.grad.numpy()


def test_grad_scaler_follows_pytorchs_step_by_step():
    factors = [1.0, float("inf"), 1.0, 1.0, 1.0, float("nan"), 1.0, 1.0]
    kwargs = dict(init_scale=2.0 ** 10, growth_interval=2, growth_factor=3.0, backoff_factor=0.25)
    ours, theirs = _train(it, factors, 8, kwargs), _train(torch, factors, 8, kwargs)
    assert ours[0] == theirs[0]  # the scales, skip by skip and growth by growth
    for a, b in zip(ours[1], theirs[1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert ours[2] == theirs[2]
    np.testing.assert_allclose(ours[3], theirs[3], rtol=1e-5, atol=1e-6)


def test_grad_scaler_state_dict_misuse_and_disabled():
    s = it.amp.GradScaler("cpu", init_scale=8.0)
    t = it.amp.GradScaler("cpu")
    t.load_state_dict(s.state_dict())
    assert t.get_scale() == 8.0 and t.is_enabled()
    w = it.zeros(2, requires_grad=True)
    opt = it.optim.SGD([w], lr=0.1)
    s.scale((w * 1.0).sum()).backward()
    s.unscale_(opt)
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 1.0])
    with pytest.raises(RuntimeError, match="already been called"):
        s.unscale_(opt)
    s.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        s.unscale_(opt)
    off = it.amp.GradScaler("cpu", enabled=False)
    assert off.get_scale() == 1.0 and off.state_dict() == {} and off.scale(w) is w
    with pytest.raises(RuntimeError, match="empty"):
        t.load_state_dict({})


def test_autocast_takes_pytorchs_arguments_and_refuses_the_old_form():
    lin = it.nn.Linear(4, 2)
    x = it.randn(3, 4)
    with it.autocast("cpu", dtype=it.bfloat16):
        assert lin(x).dtype is it.bfloat16
    with it.autocast("cuda"):  # the engine's dtype, bfloat16, by default
        assert lin(x).dtype is it.bfloat16
    with it.amp.autocast("cpu", enabled=False):
        assert lin(x).dtype is it.float32

    @it.autocast("cpu", dtype=it.bfloat16)
    def forward(t):
        return lin(t)
    assert forward(x).dtype is it.bfloat16 and lin(x).dtype is it.float32
    for old in (it.bfloat16, "bfloat16"):
        with pytest.raises(TypeError, match=r'autocast\("cpu", dtype=bfloat16\)'):
            it.autocast(old)
    with pytest.raises(ValueError, match="device_type"):
        it.autocast("tpu")
