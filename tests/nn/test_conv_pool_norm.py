"""Convolution, pooling, batch and group normalisation against PyTorch (fp32, 1e-5): values and
the gradients of input, weight and bias over a small grid of strides, padding, dilation and
groups; max/avg/adaptive pooling; batch norm's training and evaluation with its running
statistics and state_dict; group norm; the layers' construction and what they refuse."""
import math
import warnings

import numpy as np
import pytest

import infinitrain as it
from infinitrain import nn
from infinitrain.nn import functional as F

from helpers import assert_as_torch, torch_pair

torch = pytest.importorskip("torch")
TF = torch.nn.functional
TOL = dict(rtol=1e-5, atol=1e-5)


def _both(rng, *shapes):
    return torch_pair(torch, rng, *shapes)


def _check_grads(ours_out, theirs_out, ours_in, theirs_in, rng):
    assert_as_torch(torch, ours_out, theirs_out, ours_in, theirs_in, rng, TOL)


@pytest.mark.parametrize("stride,padding,dilation,groups", [
    (1, 0, 1, 1), (2, 1, 1, 1), (1, 2, 2, 1), ((2, 1), (1, 0), (1, 2), 2), (1, "same", 1, 3), (1, "same", 2, 1),
    (2, "valid", 1, 6), ((1, 2), 2, (2, 1), 6), (1, "same", 1, 6)])
def test_conv2d_values_and_gradients_equal_pytorchs(rng, stride, padding, dilation, groups):
    cin, cout = 6, 6 if groups != 3 else 9
    (x, w, b), (tx, tw, tb) = _both(rng, (2, cin, 7, 6), (cout, cin // groups, 3, 2), (cout,))
    args = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    with warnings.catch_warnings():  # PyTorch warns that an even kernel pads a copy (so do we)
        warnings.simplefilter("ignore")
        theirs = TF.conv2d(tx, tw, tb, **args)
    _check_grads(F.conv2d(x, w, b, **args), theirs, (x, w, b), (tx, tw, tb), rng)


def test_conv1d_and_unbatched_inputs_equal_pytorchs(rng):
    (x, w, b), (tx, tw, tb) = _both(rng, (3, 4, 11), (6, 2, 3), (6,))
    _check_grads(F.conv1d(x, w, b, stride=2, padding=1, dilation=2, groups=2),
                 TF.conv1d(tx, tw, tb, stride=2, padding=1, dilation=2, groups=2), (x, w, b), (tx, tw, tb), rng)
    (x, w), (tx, tw) = _both(rng, (4, 5, 5), (2, 4, 3, 3))
    _check_grads(F.conv2d(x, w, padding=1), TF.conv2d(tx, tw, padding=1), (x, w), (tx, tw), rng)


@pytest.mark.parametrize("kernel,stride,padding,dilation,ceil_mode", [
    (2, None, 0, 1, False), (3, 2, 1, 1, False), (3, 2, 1, 1, True), ((2, 3), (1, 2), (1, 0), 2, False)])
def test_max_pool2d_values_indices_and_gradients_equal_pytorchs(rng, kernel, stride, padding, dilation, ceil_mode):
    (x,), (tx,) = _both(rng, (2, 3, 9, 8))
    args = dict(kernel_size=kernel, stride=stride, padding=padding, dilation=dilation, ceil_mode=ceil_mode)
    out, idx = F.max_pool2d(x, return_indices=True, **args)
    tout, tidx = TF.max_pool2d(tx, return_indices=True, **args)
    np.testing.assert_array_equal(idx.numpy(), tidx.numpy())
    _check_grads(out, tout, (x,), (tx,), rng)


@pytest.mark.parametrize("kernel,stride,padding,ceil_mode,count_include_pad", [
    (2, None, 0, False, True), (3, 2, 1, False, True), (3, 2, 1, True, False), ((3, 2), (2, 1), (1, 1), True, True)])
def test_avg_pool2d_values_and_gradients_equal_pytorchs(rng, kernel, stride, padding, ceil_mode, count_include_pad):
    (x,), (tx,) = _both(rng, (2, 3, 9, 8))
    args = dict(kernel_size=kernel, stride=stride, padding=padding, ceil_mode=ceil_mode,
                count_include_pad=count_include_pad)
    _check_grads(F.avg_pool2d(x, **args), TF.avg_pool2d(tx, **args), (x,), (tx,), rng)
    with pytest.raises(NotImplementedError, match="divisor_override"):
        F.avg_pool2d(x, 2, divisor_override=3)


@pytest.mark.parametrize("size", [1, (3, 5), (None, 3), (9, 8)])
def test_adaptive_avg_pool2d_equals_pytorchs(rng, size):
    (x,), (tx,) = _both(rng, (2, 3, 9, 8))
    _check_grads(F.adaptive_avg_pool2d(x, size), TF.adaptive_avg_pool2d(tx, size), (x,), (tx,), rng)


@pytest.mark.parametrize("cls,shape", [("BatchNorm2d", (4, 3, 5, 6)), ("BatchNorm1d", (8, 3)),
                                       ("BatchNorm1d", (4, 3, 7))])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_batch_norm_trains_and_evaluates_as_pytorch_with_its_running_statistics(rng, cls, shape, momentum):
    ours, theirs = getattr(nn, cls)(3, momentum=momentum), getattr(torch.nn, cls)(3, momentum=momentum)
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor([0.5, 1.5, -1.0]))
        theirs.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    ours.load_state_dict({k: it.tensor(v.numpy()) for k, v in theirs.state_dict().items()})
    for step in range(3):  # three batches: the running statistics move (a cumulative mean without momentum)
        a = (rng.standard_normal(shape) * (step + 1) + step).astype(np.float32)
        x, tx = it.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
        _check_grads(ours(x), theirs(tx), (x, ours.weight, ours.bias), (tx, theirs.weight, theirs.bias), rng)
        ours.zero_grad()
        theirs.zero_grad()
    for key, value in theirs.state_dict().items():
        np.testing.assert_allclose(ours.state_dict()[key].numpy(), value.numpy(), **TOL)
    ours.eval(), theirs.eval()
    a = rng.standard_normal(shape).astype(np.float32)
    x, tx = it.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    _check_grads(ours(x), theirs(tx), (x, ours.weight, ours.bias), (tx, theirs.weight, theirs.bias), rng)
    assert int(ours.num_batches_tracked.item()) == 3


def test_batch_norm_state_dict_keys_and_the_variants_without_buffers_or_affine(rng):
    for kwargs in ({}, {"affine": False}, {"track_running_stats": False}):
        assert list(nn.BatchNorm2d(4, **kwargs).state_dict()) == list(torch.nn.BatchNorm2d(4, **kwargs).state_dict())
    a = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    for kwargs in ({"affine": False}, {"track_running_stats": False}):
        ours, theirs = nn.BatchNorm2d(2, **kwargs).eval(), torch.nn.BatchNorm2d(2, **kwargs).eval()
        np.testing.assert_allclose(ours(it.tensor(a)).detach().numpy(), theirs(torch.tensor(a)).detach().numpy(), **TOL)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        nn.BatchNorm1d(3)(it.ones(1, 3))
    with pytest.raises(ValueError, match="expected 4D input"):
        nn.BatchNorm2d(3)(it.ones(2, 3, 4))


@pytest.mark.parametrize("groups,affine", [(2, True), (1, True), (6, False)])
def test_group_norm_equals_pytorchs(rng, groups, affine):
    ours, theirs = nn.GroupNorm(groups, 6, affine=affine), torch.nn.GroupNorm(groups, 6, affine=affine)
    if affine:
        w, b = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
        with torch.no_grad():
            theirs.weight.copy_(torch.tensor(w))
            theirs.bias.copy_(torch.tensor(b))
        ours.load_state_dict({"weight": it.tensor(w), "bias": it.tensor(b)})
    (x,), (tx,) = _both(rng, (3, 6, 4, 5))
    params = [ours.weight, ours.bias] if affine else []
    tparams = [theirs.weight, theirs.bias] if affine else []
    _check_grads(ours(x), theirs(tx), [x] + params, [tx] + tparams, rng)


def test_layers_build_as_pytorchs_and_refuse_what_they_do_not_support(rng):
    it.manual_seed(0)
    conv = nn.Conv2d(4, 8, 3, padding="same", groups=2)
    bound = 1 / math.sqrt(2 * 9)  # kaiming_uniform(a=sqrt(5)) over fan_in = in/groups * kernel
    assert conv.weight.shape == (8, 2, 3, 3) and float(conv.weight.abs().max().item()) <= bound
    assert float(conv.weight.abs().max().item()) > 0.8 * bound and float(conv.bias.abs().max().item()) <= bound
    assert list(conv.state_dict()) == ["weight", "bias"]
    assert nn.Conv1d(3, 5, 4, bias=False).weight.shape == (5, 3, 4) and nn.Conv1d(3, 5, 4, bias=False).bias is None
    with pytest.raises(NotImplementedError, match="padding_mode='reflect'"):
        nn.Conv2d(3, 3, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="not supported for strided"):
        nn.Conv2d(3, 3, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(NotImplementedError, match="running_mean is bfloat16"):
        nn.BatchNorm2d(2, dtype=it.bfloat16)(it.ones(2, 2, 3, 3, dtype=it.bfloat16))
    with pytest.raises(ValueError, match="smaller than the dilated kernel"):
        F.conv2d(it.ones(1, 1, 3, 3), it.ones(1, 1, 5, 5))
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.AvgPool2d(1),
                          nn.AdaptiveAvgPool2d((2, 2)), nn.Flatten(), nn.Unflatten(1, (4, 4)), nn.Flatten())
    theirs = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                 torch.nn.MaxPool2d(2), torch.nn.AvgPool2d(1), torch.nn.AdaptiveAvgPool2d((2, 2)),
                                 torch.nn.Flatten(), torch.nn.Unflatten(1, (4, 4)), torch.nn.Flatten())
    assert list(model.state_dict()) == list(theirs.state_dict())
    theirs.load_state_dict({k: torch.tensor(v.numpy()) for k, v in model.state_dict().items()})
    a = rng.standard_normal((2, 1, 10, 10)).astype(np.float32)
    np.testing.assert_allclose(model(it.tensor(a)).detach().numpy(), theirs(torch.tensor(a)).detach().numpy(), **TOL)


def test_bfloat16_layers_compute_in_float32_and_round_as_pytorch(rng):
    """The kernels are float32: 16-bit inputs are widened and the result rounded back, as
    PyTorch's CPU kernels accumulate in float32; gradients come back in bfloat16."""
    (x, w, b), (tx, tw, tb) = _both(rng, (2, 4, 6, 6), (3, 4, 3, 3), (3,))
    ours = [t.detach().to(it.bfloat16).requires_grad_() for t in (x, w, b)]
    theirs = [t.detach().to(torch.bfloat16).requires_grad_() for t in (tx, tw, tb)]
    for fn, tfn in ((lambda a, c, d: F.max_pool2d(F.conv2d(a, c, d, padding=1), 2),
                     lambda a, c, d: TF.max_pool2d(TF.conv2d(a, c, d, padding=1), 2)),
                    (lambda a, c, d: F.adaptive_avg_pool2d(F.avg_pool2d(a, 2), 1),
                     lambda a, c, d: TF.adaptive_avg_pool2d(TF.avg_pool2d(a, 2), 1))):
        y, ty = fn(*ours), tfn(*theirs)
        assert y.dtype is it.bfloat16
        np.testing.assert_allclose(y.detach().float().numpy(), ty.detach().float().numpy(), rtol=2e-2, atol=2e-2)
    y.float().sum().backward()
    ty.float().sum().backward()
    assert ours[0].grad.dtype is it.bfloat16
    np.testing.assert_allclose(ours[0].grad.float().numpy(), theirs[0].grad.float().numpy(), rtol=2e-2, atol=1e-3)
