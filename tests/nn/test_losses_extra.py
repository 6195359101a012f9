"""The losses beyond cross-entropy's basic form against PyTorch's, values and gradients at fp32
1e-5: nll_loss/cross_entropy with class weights, [N, C, d1, ...] logits and probability targets,
binary cross-entropy (with logits, pos_weight, weight), l1, normalize; the loss modules; and
ParameterList/ParameterDict, pad_sequence and orthogonal_."""
import numpy as np
import pytest

import infinitrain as it
from infinitrain import nn
from infinitrain.nn import functional as F

torch = pytest.importorskip("torch")
TF = torch.nn.functional
TOL = dict(rtol=1e-5, atol=1e-5)


def _both(a):
    a = np.asarray(a, np.float32)
    return it.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)


def _check(ours, theirs, inputs):
    """ours(*its inputs), theirs(*torch's): values, then gradients of a weighted sum."""
    a, b = ours(*[x[0] for x in inputs]), theirs(*[x[1] for x in inputs])
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), **TOL)
    w = np.random.default_rng(5).standard_normal(tuple(b.shape)).astype(np.float32)
    (a * it.tensor(w)).sum().backward()
    (b * torch.tensor(w)).sum().backward()
    for x in inputs:
        if isinstance(x[0], it.Tensor) and x[0].requires_grad:
            np.testing.assert_allclose(x[0].grad.numpy(), x[1].grad.numpy(), **TOL)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_class_losses_with_weights_and_spatial_dimensions(reduction, rng):
    logits = rng.standard_normal((3, 4, 2, 5)).astype(np.float32)  # [N, C, d1, d2]
    target = rng.integers(0, 4, (3, 2, 5))
    target[0, 1, 2] = target[2, 0, 0] = -100
    weight = rng.uniform(0.5, 2, 4).astype(np.float32)
    t_ours, t_theirs = it.tensor(target), torch.tensor(target)
    w_ours, w_theirs = it.tensor(weight), torch.tensor(weight)
    for kw in (dict(), dict(weight=(w_ours, w_theirs)), dict(label_smoothing=0.2),
               dict(weight=(w_ours, w_theirs), label_smoothing=0.1)):
        ours_kw = {k: (v[0] if isinstance(v, tuple) else v) for k, v in kw.items()}
        theirs_kw = {k: (v[1] if isinstance(v, tuple) else v) for k, v in kw.items()}
        _check(lambda x: F.cross_entropy(x, t_ours, reduction=reduction, **ours_kw),
               lambda x: TF.cross_entropy(x, t_theirs, reduction=reduction, **theirs_kw), [_both(logits)])
    logp = torch.log_softmax(torch.tensor(logits), 1).numpy()
    _check(lambda x: F.nll_loss(x, t_ours, w_ours, reduction=reduction),
           lambda x: TF.nll_loss(x, t_theirs, w_theirs, reduction=reduction), [_both(logp)])
    t1 = np.where(target == -100, 1, target)
    _check(lambda x: nn.NLLLoss(w_ours, ignore_index=1, reduction=reduction)(x, it.tensor(t1)),
           lambda x: torch.nn.NLLLoss(w_theirs, ignore_index=1, reduction=reduction)(x, torch.tensor(t1)),
           [_both(logp)])
    _check(lambda x: nn.CrossEntropyLoss(w_ours, reduction=reduction)(x, t_ours),
           lambda x: torch.nn.CrossEntropyLoss(w_theirs, reduction=reduction)(x, t_theirs), [_both(logits)])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_probability_targets(reduction, rng):
    logits = rng.standard_normal((3, 4, 2)).astype(np.float32)
    probs = torch.softmax(torch.tensor(rng.standard_normal((3, 4, 2)), dtype=torch.float32), 1).numpy()
    weight = rng.uniform(0.5, 2, 4).astype(np.float32)
    for smoothing in (0.0, 0.3):
        _check(lambda x, p: F.cross_entropy(x, p, it.tensor(weight), reduction=reduction, label_smoothing=smoothing),
               lambda x, p: TF.cross_entropy(x, p, torch.tensor(weight), reduction=reduction,
                                             label_smoothing=smoothing),
               [_both(logits), _both(probs)])
    _check(lambda x: F.cross_entropy(x, it.tensor(probs[:, :, 0]), reduction=reduction),
           lambda x: TF.cross_entropy(x, torch.tensor(probs[:, :, 0]), reduction=reduction), [_both(logits[:, :, 0])])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_losses_and_l1(reduction, rng):
    x = rng.standard_normal((4, 3)).astype(np.float32) * 3
    x[0, 0] = 0.0  # both sides of the stable formula meet here
    y = rng.uniform(0, 1, (4, 3)).astype(np.float32)
    w = rng.uniform(0.5, 2, (4, 3)).astype(np.float32)
    pw = rng.uniform(0.5, 3, 3).astype(np.float32)
    p = (1 / (1 + np.exp(-x))).astype(np.float32)
    _check(lambda a: F.binary_cross_entropy(a, it.tensor(y), it.tensor(w), reduction=reduction),
           lambda a: TF.binary_cross_entropy(a, torch.tensor(y), torch.tensor(w), reduction=reduction), [_both(p)])
    _check(lambda a: nn.BCELoss(reduction=reduction)(a, it.tensor(y)),
           lambda a: torch.nn.BCELoss(reduction=reduction)(a, torch.tensor(y)), [_both(p)])
    _check(lambda a: F.binary_cross_entropy_with_logits(a, it.tensor(y), reduction=reduction),
           lambda a: TF.binary_cross_entropy_with_logits(a, torch.tensor(y), reduction=reduction), [_both(x)])
    _check(lambda a: nn.BCEWithLogitsLoss(it.tensor(w), reduction=reduction, pos_weight=it.tensor(pw))(a, it.tensor(y)),
           lambda a: torch.nn.BCEWithLogitsLoss(torch.tensor(w), reduction=reduction,
                                                pos_weight=torch.tensor(pw))(a, torch.tensor(y)), [_both(x)])
    _check(lambda a, b: nn.L1Loss(reduction=reduction)(a, b),
           lambda a, b: torch.nn.L1Loss(reduction=reduction)(a, b), [_both(x), _both(y)])
    _check(lambda a, b: F.l1_loss(a, b, reduction=reduction),
           lambda a, b: TF.l1_loss(a, b, reduction=reduction), [_both(x), _both(y)])


def test_binary_cross_entropy_saturates_as_pytorch_and_refuses_non_probabilities():
    p, y = [0.0, 1.0, 0.5], [1.0, 0.0, 1.0]
    np.testing.assert_allclose(F.binary_cross_entropy(it.tensor(p), it.tensor(y), reduction="none").numpy(),
                               TF.binary_cross_entropy(torch.tensor(p), torch.tensor(y), reduction="none").numpy(),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="probability"):
        F.binary_cross_entropy(it.tensor([1.5]), it.tensor([1.0]))


def test_normalize_and_legacy_reduction_arguments(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    x[1] = 0.0  # a zero row: gradient zero, not NaN
    for p, dim in ((2.0, 1), (1.0, 0), (3.0, 1), (float("inf"), 1)):
        _check(lambda a: F.normalize(a, p=p, dim=dim), lambda a: TF.normalize(a, p=p, dim=dim), [_both(x)])
    assert nn.L1Loss(size_average=False).reduction == "sum"
    assert nn.MSELoss(reduce=False).reduction == "none"


def test_class_losses_refuse_the_wrong_shapes_clearly():
    with pytest.raises(ValueError, match=r"reshape them to \[M, C\]"):
        F.cross_entropy(it.zeros(2, 3, 5), it.zeros(2, 3, dtype=it.int64))
    with pytest.raises(ValueError, match="weight"):
        F.nll_loss(it.zeros(2, 3), it.zeros(2, dtype=it.int64), weight=it.ones(4))
    with pytest.raises(ValueError, match="reduction"):
        nn.NLLLoss(reduction="avg")


def test_parameter_list_and_dict_register_with_pytorchs_names():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.ws = nn.ParameterList([it.ones(2), nn.Parameter(it.zeros(3))])
            self.ws.append(it.ones(1))
            self.named = nn.ParameterDict({"a": it.ones(2)})
            self.named["b"] = nn.Parameter(it.zeros(1))

    net = Net()
    assert list(net.state_dict()) == ["ws.0", "ws.1", "ws.2", "named.a", "named.b"]
    assert len(list(net.parameters())) == 5 and all(p.requires_grad for p in net.parameters())
    assert isinstance(net.ws[2], nn.Parameter) and net.ws[-1] is net.ws[2] and len(net.ws) == 3
    assert "a" in net.named and list(net.named.keys()) == ["a", "b"]


def test_pad_sequence_as_pytorch(rng):
    seqs = [rng.standard_normal((n, 2)).astype(np.float32) for n in (3, 1, 2)]
    ours, theirs = zip(*[_both(s) for s in seqs])
    for kw in (dict(), dict(batch_first=True, padding_value=-1.0), dict(batch_first=True, padding_side="left")):
        _check(lambda *s: nn.utils.rnn.pad_sequence(list(s), **kw),
               lambda *s: torch.nn.utils.rnn.pad_sequence(list(s), **kw), list(zip(ours, theirs)))
        for a in ours + theirs:
            a.grad = None


def test_orthogonal_init_is_orthogonal_with_gain():
    for shape in ((6, 4), (3, 8), (4, 2, 3)):
        w = it.empty(*shape)
        nn.init.orthogonal_(w, gain=2.0)
        m = w.numpy().reshape(shape[0], -1)
        gram = m @ m.T if m.shape[0] <= m.shape[1] else m.T @ m
        np.testing.assert_allclose(gram, 4 * np.eye(gram.shape[0]), atol=1e-5)
    with pytest.raises(ValueError, match="2 or more"):
        nn.init.orthogonal_(it.empty(3))


def test_binary_cross_entropy_of_saturated_probabilities_has_pytorchs_finite_gradient():
    """A float32 sigmoid is exactly 1 past a logit of ~17: log's infinite gradient times the
    clamp's zero made the whole gradient NaN (PyTorch's backward gives 0 there)."""
    logits, target, weight = [20.0, -120.0, 0.5, 3.0], [1.0, 0.0, 1.0, 0.3], [1.0, 2.0, 0.5, 1.0]
    z = it.tensor(logits, requires_grad=True)
    F.binary_cross_entropy(z.sigmoid(), it.tensor(target), weight=it.tensor(weight)).backward()
    tz = torch.tensor(logits, requires_grad=True)
    torch.nn.functional.binary_cross_entropy(tz.sigmoid(), torch.tensor(target), weight=torch.tensor(weight)).backward()
    np.testing.assert_allclose(z.grad.numpy(), tz.grad.numpy(), rtol=1e-5, atol=1e-7)
