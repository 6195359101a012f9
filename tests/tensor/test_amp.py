"""bf16 autocast: which ops run in which dtype, fp32 master weights and gradients, and GPT-2
training that follows the fp32 loss curve with less memory."""
import numpy as np
import pytest

import infinitrain as it
import infinitrain.nn.functional as F
from infinitrain import nn
from infinitrain.data import TokenLoader, write_shard
from infinitrain.models import gpt2


def test_op_dtypes_under_autocast():
    lin = nn.Linear(8, 4)
    ln = nn.LayerNorm(4)
    x = it.randn(3, 8)
    with it.autocast("cpu", dtype=it.bfloat16):
        h = lin(x)
        assert h.dtype is it.bfloat16                          # matrix products in bf16
        assert ln(h).dtype is it.float32                       # normalisation in fp32
        assert F.softmax(h, -1).dtype is it.float32
        assert (h + x[:, :4]).dtype is it.float32              # mixed elementwise: promoted
        assert (x @ x.t()).dtype is it.bfloat16
    assert lin(x).dtype is it.float32                          # off again outside
    with it.autocast("cpu", dtype=it.bfloat16, enabled=False):
        assert lin(x).dtype is it.float32


def test_master_weights_and_gradients_stay_fp32():
    lin = nn.Linear(8, 4)
    with it.autocast("cpu", dtype="bfloat16"):
        loss = F.cross_entropy(lin(it.randn(5, 8)), it.tensor([0, 1, 2, 3, 0]))
    loss.backward()
    assert lin.weight.dtype is it.float32 and lin.weight.grad.dtype is it.float32
    assert lin.bias.grad.dtype is it.float32


def _train(tmp_path, dtype, steps=20):
    it.manual_seed(0)
    model = gpt2("tiny")
    opt = it.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0)
    loader = TokenLoader(tmp_path / "t.bin", 8, 64)
    losses = []
    for i in range(steps):
        x, y = loader.next_batch()
        if i == 2:
            it.reset_peak_memory_stats()
        with it.autocast("cpu", dtype=dtype, enabled=dtype != "float32"):
            _, loss = model(x, y, return_logits=False)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return np.array(losses), it.max_memory_allocated()


@pytest.mark.slow
def test_bf16_training_follows_fp32_with_less_memory(tmp_path):
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 700), 20))
    fp32, mem32 = _train(tmp_path, "float32")
    bf16, mem16 = _train(tmp_path, "bfloat16")
    assert np.abs(fp32 - bf16).max() < 1e-2, np.abs(fp32 - bf16).max()
    assert fp32[-1] < fp32[0] - 1.0
    assert mem16 < mem32, (mem16, mem32)
