"""What GPT-2 and LLaMA-3 share as causal language models, each test run on both."""
import numpy as np
import pytest

import infinitrain as it
from infinitrain.models import gpt2, llama3

BUILD = {"gpt2": gpt2, "llama3": llama3}


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_overfits_one_batch(model):
    it.manual_seed(0)
    net = BUILD[model]("tiny")
    opt = it.optim.AdamW(net.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    tokens = np.random.default_rng(0).integers(0, 50257, (2, 17))
    x, y = it.tensor(tokens[:, :-1]), it.tensor(tokens[:, 1:])
    losses = []
    for _ in range(60):
        _, loss = net(x, y, return_logits=False)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 10 and losses[-1] < 0.2, losses[::10]


def test_the_logits_gradient_is_written_over_the_logits_when_the_loop_dropped_them():
    """llm.c's saving: backward writes the logits' gradient into their own memory when nothing
    else holds them. A view's reference to the tensor it views (for in-place writes) blocked it,
    and a GPT-2 small step held a logits-sized buffer more (peak 510 MB -> 659 MB)."""
    from infinitrain.models import GPT2, GPT2Config
    m = GPT2(GPT2Config(block_size=64, vocab_size=2000, n_layer=1, n_head=2, n_embd=32), seed=0)
    x = it.tensor(np.random.default_rng(0).integers(0, 2000, (8, 64)))
    logits_mb = 8 * 64 * 2000 * 4 / 2**20  # (at least: the vocabulary is padded)
    it.reset_peak_memory_stats()
    _, loss = m(x, x, return_logits=False)
    forward = it.max_memory_allocated() / 2**20
    loss.backward()
    assert it.max_memory_allocated() / 2**20 < forward + 0.5 * logits_mb
