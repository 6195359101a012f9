"""nn.Module behaviour, layers, and optimizers/schedules against reference formulas."""
import math

import numpy as np
import pytest

import infinitrain as it
from infinitrain import nn, optim
from infinitrain.optim import lr_scheduler


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.body = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.register_buffer("scale", it.ones(4))

    def forward(self, idx):
        return self.head(self.norm(self.body(self.emb(idx)) * self.scale))


def test_module_registration_and_tied_weights():
    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == ["emb.weight", "body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias",
                     "norm.weight", "norm.bias"]  # the tied head weight once
    sd = net.state_dict()
    assert "head.weight" in sd and "scale" in sd
    assert net.num_parameters() == 40 + 32 + 8 + 32 + 4 + 4 + 4
    assert len(list(net.modules())) == 8  # Net, emb, body, its 3 layers, norm, head
    assert "Linear(in_features=4, out_features=8, bias=True)" in repr(net)


def test_state_dict_round_trip_and_strict_errors():
    a, b = Net(), Net()
    b.load_state_dict(a.state_dict())
    idx = it.tensor([[1, 2, 3]])
    np.testing.assert_array_equal(a(idx).detach().numpy(), b(idx).detach().numpy())
    sd = a.state_dict()
    bad = dict(sd)
    del bad["norm.bias"]
    bad["extra.weight"] = it.zeros(2)
    bad["body.0.weight"] = it.zeros(3, 3)
    with pytest.raises(RuntimeError) as e:
        b.load_state_dict(bad)
    msg = str(e.value)
    assert "missing keys: norm.bias" in msg and "unexpected keys: extra.weight" in msg
    assert "body.0.weight: checkpoint (3, 3) vs model (8, 4)" in msg
    del bad["body.0.weight"]
    bad["body.0.weight"] = sd["body.0.weight"]
    b.load_state_dict(bad, strict=False)  # missing/unexpected tolerated, shapes still checked


def test_train_eval_zero_grad_to_apply():
    net = Net()
    net.eval()
    assert not net.body[0].training
    net.train()
    assert net.body[1].training
    net(it.tensor([[1, 2]])).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad(set_to_none=False)
    assert all(np.all(p.grad.numpy() == 0) for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    w = net.emb.weight
    net.to(it.bfloat16)
    assert net.emb.weight is w and w.dtype is it.bfloat16 and net.head.weight is w
    assert net(it.tensor([[1]])).dtype is it.bfloat16
    net.register_buffer("ids", it.arange(4))
    net.register_buffer("scale", it.ones(2))
    net.to("cpu", it.float32)  # PyTorch's rule: a dtype converts floating tensors only
    assert net.ids.dtype is it.int64 and net.scale.dtype is it.float32 and w.dtype is it.float32
    net.to(dtype=it.bfloat16, device=it.device("cpu"))
    assert net.ids.dtype is it.int64 and net.scale.dtype is it.bfloat16
    with pytest.raises(TypeError, match="takes a dtype, a device or a tensor"):
        net.to(3)
    lin = nn.Linear(3, 2, bias=True, device="cpu", dtype=it.bfloat16)  # PyTorch's factory keywords
    assert lin.weight.dtype is it.bfloat16 and lin.bias.device == "cpu"
    seen = []
    net.apply(lambda m: seen.append(type(m).__name__))
    assert seen[-1] == "Net"


def test_forward_hooks_see_and_replace_inputs_and_outputs():
    """PyTorch's forward pre-hooks and forward hooks: called in order around forward, may
    replace the arguments or the output, and remove() takes them away."""
    lin, calls = nn.Linear(3, 2), []
    x = it.ones(1, 3)

    def pre(module, args):
        calls.append(("pre", module is lin))
        return (args[0] * 2,)

    def post(module, args, out):
        calls.append(("post", float(args[0].sum())))
        return out + 1

    h1, h2 = lin.register_forward_pre_hook(pre), lin.register_forward_hook(post)
    with it.no_grad():
        plain = lin.forward(x * 2) + 1
        got = lin(x)
    np.testing.assert_array_equal(got.numpy(), plain.numpy())
    assert calls == [("pre", True), ("post", 6.0)]
    h1.remove()
    h2.remove()
    with it.no_grad():
        np.testing.assert_array_equal(lin(x).numpy(), lin.forward(x).numpy())
    assert len(calls) == 2


def test_containers_and_layers_against_numpy(rng):
    lin = nn.Linear(5, 3)
    x = rng.standard_normal((2, 5)).astype(np.float32)
    np.testing.assert_allclose(lin(it.tensor(x)).detach().numpy(),
                               x @ lin.weight.detach().numpy().T + lin.bias.detach().numpy(), rtol=1e-5, atol=1e-6)
    ml = nn.ModuleList([nn.ReLU(), nn.Sigmoid()])
    md = nn.ModuleDict({"a": nn.SiLU()})
    assert len(ml) == 2 and "a" in md and isinstance(ml[1], nn.Sigmoid)
    d = nn.Dropout(0.5)
    d.eval()
    t = it.ones(10)
    assert d(t) is t
    loss = nn.CrossEntropyLoss()(it.zeros(2, 4), it.tensor([0, 3]))
    assert abs(loss.item() - math.log(4)) < 1e-6


def _quadratic_problem(opt_cls, steps=5, **kw):
    """Minimises sum((w - 3)^2) and returns the trajectory of w."""
    w = nn.Parameter(it.tensor([1.0, -2.0, 0.5]))
    opt = opt_cls([w], **kw)
    path = []
    for _ in range(steps):
        opt.zero_grad()
        ((w - 3.0) ** 2).sum().backward()
        opt.step()
        path.append(w.detach().numpy().copy())
    return np.array(path), opt


def test_sgd_matches_reference():
    path, _ = _quadratic_problem(optim.SGD, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)
    w, buf = np.array([1.0, -2.0, 0.5]), None
    for k in range(5):
        g = 2 * (w - 3) + 0.01 * w
        buf = g if buf is None else 0.9 * buf + g
        w = w - 0.1 * (g + 0.9 * buf)
        np.testing.assert_allclose(path[k], w, rtol=1e-5)


@pytest.mark.parametrize("cls,decoupled", [(optim.AdamW, True), (optim.Adam, False)])
def test_adam_family_matches_reference(cls, decoupled):
    path, _ = _quadratic_problem(cls, lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    w, m, v = np.array([1.0, -2.0, 0.5]), 0.0, 0.0
    for k in range(1, 6):
        g = 2 * (w - 3)
        if decoupled:
            w = w * (1 - 0.1 * 0.1)
        else:
            g = g + 0.1 * w
        m = 0.9 * m + 0.1 * g
        v = 0.99 * v + 0.01 * g * g
        w = w - 0.1 / (1 - 0.9 ** k) * m / (np.sqrt(v) / np.sqrt(1 - 0.99 ** k) + 1e-8)
        np.testing.assert_allclose(path[k - 1], w, rtol=1e-5)


def test_optimizer_state_dict_resumes_exactly():
    path, opt = _quadratic_problem(optim.AdamW, steps=3, lr=0.1)
    sd = opt.state_dict()
    w2 = nn.Parameter(it.tensor(path[-1]))
    opt2 = optim.AdamW([w2], lr=0.1)
    opt2.load_state_dict(sd)
    w = opt.param_groups[0]["params"][0]
    for p, o in ((w, opt), (w2, opt2)):
        o.zero_grad()
        ((p - 3.0) ** 2).sum().backward()
        o.step()
    np.testing.assert_array_equal(w.detach().numpy(), w2.detach().numpy())
    with pytest.raises(ValueError, match="parameter groups"):
        optim.AdamW([w2], lr=0.1).load_state_dict({"state": {}, "param_groups": []})


def test_optimizer_argument_errors():
    w = nn.Parameter(it.zeros(2))
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="betas"):
        optim.AdamW([w], betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="requires_grad"):
        optim.SGD([it.zeros(2)], lr=0.1)


def test_schedules():
    w = nn.Parameter(it.zeros(1))
    opt = optim.SGD([w], lr=1.0)
    s = lr_scheduler.LinearWarmupCosineLR(opt, warmup_steps=2, total_steps=6, min_lr_ratio=0.1)
    lrs = []
    for _ in range(7):
        lrs.append(opt.param_groups[0]["lr"])
        s.step()
    expected = [0.5, 1.0] + [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(4)] + [0.1]
    np.testing.assert_allclose(lrs, expected)
    opt2 = optim.SGD([nn.Parameter(it.zeros(1))], lr=2.0)
    lr_scheduler.ConstantLR(opt2)
    assert opt2.param_groups[0]["lr"] == 2.0


@pytest.mark.parametrize("decay", ["constant", "cosine", "linear"])
def test_warmup_then_decay_to_the_minimum(decay):
    """LinearWarmupDecayLR: llm.c's warmup ((k+1)/warmup), then constant, cosine (llm.c's and Megatron's
    formula) or linear decay to min_lr_ratio at total_steps, held there after."""
    w = nn.Parameter(it.zeros(1))
    opt = optim.SGD([w], lr=2.0)
    s = lr_scheduler.LinearWarmupDecayLR(opt, warmup_steps=2, total_steps=7, min_lr_ratio=0.25, decay=decay)
    lrs = []
    for _ in range(9):
        lrs.append(opt.param_groups[0]["lr"])
        s.step()
    p = [k / 5 for k in range(5)]
    shape = {"constant": [1.0] * 5, "cosine": [0.5 * (1 + math.cos(math.pi * q)) for q in p],
             "linear": [1 - q for q in p]}[decay]
    tail = [1.0, 1.0] if decay == "constant" else [0.25, 0.25]
    expected = [0.5, 1.0] + ([1.0] * 5 if decay == "constant" else [0.25 + 0.75 * f for f in shape]) + tail
    np.testing.assert_allclose(lrs, [2.0 * e for e in expected])
    with pytest.raises(ValueError, match="decay must be one of"):
        lr_scheduler.LinearWarmupDecayLR(opt, 0, 5, decay="step")


def test_clip_grad_norm():
    a, b = nn.Parameter(it.zeros(3)), nn.Parameter(it.zeros(4))
    a.grad, b.grad = it.tensor([3.0, 0.0, 0.0]), it.tensor([0.0, 4.0, 0.0, 0.0])
    norm = nn.utils.clip_grad_norm_([a, b], 1.0)
    assert abs(norm - 5.0) < 1e-6
    np.testing.assert_allclose(a.grad.numpy(), [0.6, 0, 0], rtol=1e-5)
    np.testing.assert_allclose(b.grad.numpy(), [0, 0.8, 0, 0], rtol=1e-5)


def test_a_parameter_given_twice_is_refused_not_stepped_twice():
    """AdamW([p, p]) stepped p twice per step (PyTorch refuses duplicate parameters)."""
    p = nn.Parameter(it.zeros(2))
    with pytest.raises(ValueError, match="holds the same parameter more than once"):
        optim.AdamW([p, p], lr=0.1)
    with pytest.raises(ValueError, match="more than one parameter group"):
        optim.AdamW([{"params": [p]}, {"params": [p]}], lr=0.1)
