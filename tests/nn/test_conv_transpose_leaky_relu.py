"""ConvTranspose2d and LeakyReLU against PyTorch (fp32, 1e-5): values and the gradients of
input, weight and bias over strides, padding, output_padding, dilation and groups; the layer's
shape, initialisation bounds and output_size; what they refuse. Dropout2d: whole channels."""
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


@pytest.mark.parametrize("cin,cout,kernel,stride,padding,output_padding,groups,dilation,size", [
    (4, 6, 3, 2, 1, 1, 2, 1, (5, 6)), (8, 16, 4, 1, 0, 0, 1, 1, (1, 1)), (16, 1, 4, 2, 1, 0, 1, 1, (4, 4)),
    (3, 4, (3, 2), (3, 2), (2, 0), (2, 1), 1, (2, 1), (6, 3)), (6, 6, 3, 1, 1, 0, 6, 1, (5, 5))])
def test_conv_transpose2d_values_and_gradients_equal_pytorchs(rng, cin, cout, kernel, stride, padding,
                                                              output_padding, groups, dilation, size):
    k = (kernel, kernel) if isinstance(kernel, int) else kernel
    (x, w, b), (tx, tw, tb) = _both(rng, (2, cin, *size), (cin, cout // groups, *k), (cout,))
    args = (stride, padding, output_padding, groups, dilation)
    _check_grads(F.conv_transpose2d(x, w, b, *args), TF.conv_transpose2d(tx, tw, tb, *args), [x, w, b], [tx, tw, tb],
                 rng)


def test_conv_transpose2d_layer_as_pytorchs(rng):
    ours, theirs = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, groups=2), \
        torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, groups=2)
    assert tuple(ours.weight.shape) == tuple(theirs.weight.shape) == (4, 3, 3, 3)
    bound = 1 / np.sqrt(3 * 9)  # PyTorch's fan_in of a transposed weight: its dim 1 times the kernel
    assert np.abs(ours.weight.detach().numpy()).max() <= bound and np.abs(ours.bias.detach().numpy()).max() <= bound
    ours.load_state_dict({k: it.tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()})
    x = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    for size in (None, (10, 10), (1, 6, 9, 10)):
        np.testing.assert_allclose(ours(it.tensor(x), output_size=size).detach().numpy(),
                                   theirs(torch.tensor(x), output_size=size).detach().numpy(), **TOL)
    assert repr(ours) == repr(theirs)
    with pytest.raises(ValueError, match="output_padding"):
        F.conv_transpose2d(it.tensor(x), ours.weight, stride=2, output_padding=2)
    with pytest.raises(ValueError, match="padding"):
        nn.ConvTranspose2d(4, 6, 3, padding="same")


def test_leaky_relu_values_and_gradients_equal_pytorchs(rng):
    (x,), (tx,) = _both(rng, (5, 7))
    with it.no_grad():
        x[0, :3] = 0.0
    with torch.no_grad():
        tx[0, :3] = 0.0  # the gradient at 0 is the slope's, as PyTorch's
    _check_grads(nn.LeakyReLU(0.2)(x), torch.nn.LeakyReLU(0.2)(tx), [x], [tx], rng)
    np.testing.assert_allclose(F.leaky_relu(x).detach().numpy(), TF.leaky_relu(tx).detach().numpy(), **TOL)
    assert repr(nn.LeakyReLU(0.2)) == repr(torch.nn.LeakyReLU(0.2))
    with pytest.raises(NotImplementedError, match="inplace"):
        nn.LeakyReLU(0.2, inplace=True)


def test_dropout2d_drops_whole_channels_as_pytorchs(rng):
    """The masks are infinitrain's draws (not PyTorch's stream): each channel is all zeros or
    all scaled by 1 / (1 - p), about p of them zeros, the gradient the same mask; in eval mode
    the identity, and the layer's repr is PyTorch's."""
    it.manual_seed(0)
    x = it.tensor(rng.standard_normal((8, 16, 3, 3)).astype(np.float32) + 5.0, requires_grad=True)
    y = nn.Dropout2d(0.25)(x)
    ys, xs = y.detach().numpy().reshape(128, 9), x.detach().numpy().reshape(128, 9)
    dropped = (ys == 0).all(1)
    np.testing.assert_allclose(ys[~dropped], xs[~dropped] / 0.75, rtol=1e-6)
    assert 0.1 < dropped.mean() < 0.4
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy().reshape(128, 9), np.where(dropped, 0.0, 1 / 0.75)[:, None]
                               * np.ones((1, 9)), rtol=1e-6)
    layer = nn.Dropout2d(0.25).eval()
    assert layer(x) is x and repr(layer) == repr(torch.nn.Dropout2d(0.25))
    assert F.dropout2d(x[0], 0.5).shape == (16, 3, 3)
    with pytest.raises(ValueError, match="4-D"):
        F.dropout2d(x.view(8, 144))
