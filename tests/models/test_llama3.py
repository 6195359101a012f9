"""LLaMA-3: GQA attention with rotary embeddings against numpy, overfitting one batch,
checkpoints (including llm.c's integer-truncated header floats), RoPE scaling, the example."""
import math

import numpy as np
import pytest

import infinitrain as it
from infinitrain.data import DataFormatError, write_shard
from infinitrain.models import LLaMA3, llama3
from infinitrain.models.llama3 import LLaMA3Config, rope_frequencies
from helpers import example


def test_attention_gqa_with_rope_against_numpy(rng):
    it.manual_seed(0)
    model = llama3("tiny")  # 4 heads, 2 kv heads, head_dim 16
    cfg, attn = model.config, model.transformer.h[0].attn
    B, T, C, H, KV, D = 2, 7, cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.head_dim
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    out = attn(it.tensor(x), model.rope_cos[:T], model.rope_sin[:T]).detach().numpy()

    w, wp = (attn.c_attn.weight.detach().numpy().astype(np.float64),
             attn.c_proj.weight.detach().numpy().astype(np.float64))
    qkv = x.astype(np.float64) @ w.T
    q = qkv[..., :H * D].reshape(B, T, H, D)
    k = qkv[..., H * D:(H + KV) * D].reshape(B, T, KV, D)
    v = qkv[..., (H + KV) * D:].reshape(B, T, KV, D)
    ang = np.outer(np.arange(T), rope_frequencies(cfg))

    def rope(t):
        c, s = np.cos(ang)[None, :, None], np.sin(ang)[None, :, None]
        r = np.empty_like(t)
        r[..., 0::2] = t[..., 0::2] * c - t[..., 1::2] * s
        r[..., 1::2] = t[..., 0::2] * s + t[..., 1::2] * c
        return r
    q, k = rope(q).transpose(0, 2, 1, 3), rope(k).transpose(0, 2, 1, 3)
    k, v = np.repeat(k, H // KV, 1), np.repeat(v.transpose(0, 2, 1, 3), H // KV, 1)
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    y = (p / p.sum(-1, keepdims=True)) @ v
    ref = y.transpose(0, 2, 1, 3).reshape(B, T, C) @ wp.T
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_ffn_sizes_of_presets():
    from infinitrain.models.llama3 import PRESETS
    assert PRESETS["llama3.2-1b"].ffn_hidden == 8192
    assert PRESETS["llama3.2-3b"].ffn_hidden == 8192
    assert PRESETS["llama3-8b"].ffn_hidden == 14336


def test_rope_scaling():
    base = LLaMA3Config(n_embd=4096, n_head=32, rope_theta=500000.0)
    scaled = LLaMA3Config(n_embd=4096, n_head=32, rope_theta=500000.0, use_scaled_rope=True)
    f0, f1 = rope_frequencies(base), rope_frequencies(scaled)
    wavelen = 2 * np.pi / f0
    assert np.allclose(f1[wavelen < 8192 / 4], f0[wavelen < 8192 / 4])   # high frequencies kept
    assert np.allclose(f1[wavelen > 8192], f0[wavelen > 8192] / 8)       # low ones divided by 8
    mid = (wavelen >= 8192 / 4) & (wavelen <= 8192)
    assert mid.any() and np.all(f1[mid] <= f0[mid]) and np.all(f1[mid] >= f0[mid] / 8)


def test_checkpoint_round_trip_and_truncated_floats(tmp_path):
    it.manual_seed(3)
    model = llama3("tiny", ffn_dim_multiplier=1.3, rope_theta=500000.0, use_scaled_rope=True)
    model.save_llmc(tmp_path / "m.bin")
    header = np.fromfile(tmp_path / "m.bin", dtype="<i4", count=16)
    assert header[:8].tolist() == [20240803, 3, 256, 50257, 2, 4, 2, 64]
    assert np.isclose(header.view("<f4")[11], 500000.0) and np.isclose(header.view("<f4")[8], 1.3)
    loaded = LLaMA3.from_llmc(tmp_path / "m.bin")
    assert loaded.config == model.config
    for (n, a), (_, b) in zip(model.named_parameters(), loaded.named_parameters()):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy(), err_msg=n)
    x = it.tensor([[1, 2, 3, 4]])
    np.testing.assert_array_equal(model(x, x)[1].detach().numpy(), loaded(x, x)[1].detach().numpy())
    # llm.c's train_llama3.py writes the float fields truncated to integers
    data = bytearray((tmp_path / "m.bin").read_bytes())
    bad = np.frombuffer(bytes(data[:1024]), dtype="<i4").copy()
    bad[8], bad[10], bad[11] = 1, 0, 500000
    (tmp_path / "int.bin").write_bytes(bad.tobytes() + bytes(data[1024:]))
    with pytest.raises(DataFormatError, match="truncated to int"):
        LLaMA3.from_llmc(tmp_path / "int.bin")
    (tmp_path / "short.bin").write_bytes(bytes(data[:-8]))
    with pytest.raises(DataFormatError, match="truncated"):
        LLaMA3.from_llmc(tmp_path / "short.bin")


@pytest.mark.slow
def test_llama3_example_runs(tmp_path):
    pattern = np.random.default_rng(0).integers(0, 300, 64)
    write_shard(tmp_path / "train.bin", np.tile(pattern, 40))
    out = example(1, "llama3", ["--input_bin", tmp_path / "train.bin", "--model", "tiny", "--batch_size", "2",
                                "--sequence_length", "32", "--num_iteration", "6", "--learning_rate", "3e-3"])
    lines = [ln for ln in out.splitlines() if ln.startswith("step")]
    assert len(lines) == 6 and "DP=1, TP=1, SP=0, PP=1" in lines[-1]
    assert float(lines[-1].split("train loss ")[1].split()[0]) < float(lines[0].split("train loss ")[1].split()[0])
