"""autograd.defer_weight_grads: a backward pass that gives the inputs' gradients now (B) and the
weights' later (W), as the zero-bubble pipeline schedules run it. On every layer type the
gradients after W are the bits of a plain backward; before W no parameter has a gradient and
no gradient hook has run."""
import numpy as np
import pytest

import infinitrain as it
from infinitrain import nn
from infinitrain.amp import autocast
from infinitrain.autograd import checkpoint, defer_weight_grads, run_deferred_weight_grads
from infinitrain.models import GPT2Config, LLaMA3Config
from infinitrain.models.gpt2 import GPT2
from infinitrain.models.llama3 import LLaMA3
from infinitrain.nn.lora import apply_lora
from helpers import MPI_SCRIPTS, mpirun


class _Blocks(nn.Module):
    """Every layer type with a weight part: Embedding, LayerNorm, RMSNorm, Linear (with and
    without bias), a weight used twice (tied: the embedding's table as the head)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.ln = nn.LayerNorm(8)
        self.rms = nn.RMSNorm(8)
        self.fc = nn.Linear(8, 16)
        self.proj = nn.Linear(16, 8, bias=False)

    def forward(self, idx, x):
        h = self.emb(idx) + x
        h = h + self.proj(nn.functional.gelu(self.fc(self.ln(h))))
        return nn.functional.linear(self.rms(h), self.emb.weight)


def _deferred_grads(model, step, inputs=()):
    model.zero_grad()
    for t in inputs:
        t.grad = None
    seen = []
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda p: seen.append(id(p)))
    with defer_weight_grads() as w:
        step()
    early = [t.grad.numpy().copy() for t in inputs]  # the input gradients exist after B
    assert not seen and all(p.grad is None for p in model.parameters()), "a weight gradient came before W"
    w.backward_weight()
    assert sorted(seen) == sorted(id(p) for p in model.parameters() if p.requires_grad)  # each once
    return early + [p.grad.numpy().copy() if p.grad is not None else None for p in model.parameters()]


def _equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if x is None or y is None:
            assert x is None and y is None
        else:
            np.testing.assert_array_equal(x, y)


def _compare(model, step, inputs=()):
    model.zero_grad()
    for t in inputs:
        t.grad = None
    step()
    ref = [t.grad.numpy().copy() for t in inputs] + \
        [p.grad.numpy().copy() if p.grad is not None else None for p in model.parameters()]
    _equal(_deferred_grads(model, step, inputs), ref)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_layer_type_bit_identical(dtype):
    it.manual_seed(0)
    model = _Blocks()
    idx = it.randint(0, 11, (2, 5))
    x = it.randn(2, 5, 8, requires_grad=True)

    def step():
        with autocast("cpu", dtype=dtype, enabled=dtype != "float32"):  # under bf16 the weights pass a cast
            y = model(idx, x)
        (y.float() ** 2).mean().backward()
    _compare(model, step, [x])


def test_recomputation_and_lora_bit_identical():
    it.manual_seed(1)
    model = _Blocks()
    apply_lora(model, 2, targets=("fc", "proj"))
    idx = it.randint(0, 11, (2, 5))
    x = it.randn(2, 5, 8, requires_grad=True)

    def step():
        y = checkpoint(model, idx, x)
        (y ** 2).mean().backward()
    _compare(model, step, [x])


@pytest.mark.parametrize("name", ["gpt2", "llama3"])
def test_models_bit_identical_over_micro_batches(name):
    """Two micro-batches whose W's run after both B's (a zero-bubble stage's order), against
    two plain backward passes."""
    if name == "gpt2":
        model = GPT2(GPT2Config(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=16), seed=3)
    else:
        model = LLaMA3(LLaMA3Config(block_size=16, vocab_size=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=16),
                       seed=3)
    rng = np.random.default_rng(0)
    batches = [it.from_numpy(rng.integers(0, 64, (2, 8))) for _ in range(2)]

    def loss(b):
        return model(b, b)[1]
    model.zero_grad()
    for b in batches:
        loss(b).backward()
    ref = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    handles = []
    for b in batches:
        with defer_weight_grads() as w:
            loss(b).backward()
        handles.append(w)
    assert all(p.grad is None for p in model.parameters())
    for w in handles:
        w.backward_weight()
    _equal([p.grad.numpy() for p in model.parameters()], ref)
    with defer_weight_grads():
        loss(batches[0]).backward()
    run_deferred_weight_grads()  # everything left on this thread
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.mpi
def test_tensor_parallel_layers_bit_identical():
    """VocabParallelEmbedding, a sequence-parallel LayerNorm, the column-parallel linear (with
    its collectives beside the products and without) and the row-parallel one (its bias added
    after the TP sum) at TP 2, with and without SP, fp32 and bf16 autocast."""
    out = mpirun(2, [MPI_SCRIPTS / "deferred_weight_grads_tp.py"])
    assert out.count(" OK") == 2, out
