"""GPT-2 against PyTorch: the same llm.c checkpoint and token shard give PyTorch's loss and
gradients at step 0 and its losses over 10 AdamW steps (skipped when torch is not installed)."""
import sys
from pathlib import Path

import numpy as np
import pytest

import infinitrain as it
from infinitrain.data import TokenLoader, write_shard
from infinitrain.models import GPT2, gpt2

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from torch_gpt2 import from_infinitrain  # noqa: E402


@pytest.fixture
def checkpoint_and_shard(tmp_path):
    it.manual_seed(7)
    model = gpt2("tiny", n_layer=2, n_head=4, n_embd=64, block_size=64)
    ckpt = tmp_path / "model.bin"
    model.save_llmc(ckpt)
    rng = np.random.default_rng(0)
    shard = tmp_path / "tokens.bin"
    write_shard(shard, np.tile(rng.integers(0, 50257, 160), 26))  # repeats: learnable
    return ckpt, shard


def test_step0_loss_and_gradients_match_pytorch(checkpoint_and_shard):
    ckpt, shard = checkpoint_and_shard
    model = GPT2.from_llmc(ckpt)
    ref = from_infinitrain(model)
    x, y = TokenLoader(shard, 4, 32).next_batch()
    _, loss = model(x, y, return_logits=False)
    loss.backward()
    ref_loss = ref(torch.from_numpy(x.numpy()), torch.from_numpy(y.numpy()))
    ref_loss.backward()
    assert abs(loss.item() - ref_loss.item()) < 1e-5
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        g, rg = p.grad.numpy(), ref_params[name].grad.numpy()
        np.testing.assert_allclose(g, rg, rtol=1e-3, atol=2e-6, err_msg=name)


@pytest.mark.slow
def test_ten_adamw_steps_match_pytorch(checkpoint_and_shard):
    ckpt, shard = checkpoint_and_shard
    model = GPT2.from_llmc(ckpt)
    ref = from_infinitrain(model)
    opt = it.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    loader = TokenLoader(shard, 4, 32)
    ours, theirs = [], []
    for _ in range(10):
        x, y = loader.next_batch()
        _, loss = model(x, y, return_logits=False)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ours.append(loss.item())
        ref_loss = ref(torch.from_numpy(x.numpy()), torch.from_numpy(y.numpy()))
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        theirs.append(ref_loss.item())
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=2e-5)
    assert ours[-1] < ours[0] - 0.5
