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
