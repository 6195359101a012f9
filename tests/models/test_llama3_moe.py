"""LLaMA-3 with mixture-of-experts layers: it trains, recomputation keeps its gradients, its
weights are drawn as one process draws them, its presets are valid, and the formats that cannot
hold experts refuse it clearly."""
from dataclasses import replace

import numpy as np
import pytest

import infinitrain as it
from infinitrain.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from infinitrain.models.llama3 import PRESETS, LLaMA3
from infinitrain.nn.moe import MoE
from infinitrain.optim import AdamW

CFG = replace(PRESETS["moe-tiny"], block_size=32, vocab_size=300, n_embd=32, moe_ffn_hidden=16,
              moe_shared_experts=1, n_layer=3, moe_layer_freq=2)


def batch(seed=0, B=4, T=16):
    data = np.random.default_rng(seed).integers(0, 300, (B, T + 1))
    return it.from_numpy(data[:, :-1].copy()), it.from_numpy(data[:, 1:].copy())


def test_layers_and_names():
    model = LLaMA3(CFG, seed=1)
    assert [i for i, b in enumerate(model.transformer.h) if isinstance(b.mlp, MoE)] == [0, 2]
    names = dict(model.named_parameters())
    assert "transformer.h.0.mlp.experts.3.down_proj.weight" in names
    assert "transformer.h.2.mlp.shared_experts.up_proj.weight" in names
    assert "transformer.h.1.mlp.c_fc.weight" in names  # every second layer dense


def test_weights_drawn_in_one_process_order():
    model = LLaMA3(CFG, seed=1)
    for i, block in enumerate(model.transformer.h):
        drawn = sum(p.numel() for n, p in block.named_parameters() if p.ndim == 2)
        assert drawn == model._block_numel(i)
    again = LLaMA3(CFG, seed=1)
    for (n, a), b in zip(model.named_parameters(), again.parameters()):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy(), err_msg=n)


def test_trains_and_balances():
    model = LLaMA3(replace(CFG, moe_router="sigmoid", moe_bias_update_rate=1e-3), seed=1)
    opt = AdamW(model.parameters(), lr=3e-3)
    x, y = batch()
    losses = []
    for _ in range(8):
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        stats = model.update_moe_biases()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5, losses
    assert set(stats.tokens_per_expert) == {0, 2} and stats.tokens_per_expert[0].sum() == 4 * 16 * 2
    assert stats.aux_loss is not None and stats.imbalance >= 1.0
    assert np.abs(model.transformer.h[0].mlp.gate.e_score_correction_bias.numpy()).max() > 0


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recompute_keeps_gradients(mode):
    x, y = batch(1)
    grads = []
    for m in ("none", mode):
        model = LLaMA3(CFG, seed=2).set_recompute(m)
        _, loss = model(x, y)
        loss.backward()
        grads.append({n: p.grad.numpy().copy() for n, p in model.named_parameters()})
    for n, g in grads[0].items():
        np.testing.assert_allclose(grads[1][n], g, rtol=1e-5, atol=1e-6, err_msg=n)


def test_presets_are_valid():
    for name in ("moe-tiny", "moe-small", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3-small"):
        PRESETS[name].validate()
    assert PRESETS["deepseek-v3-small"].moe_router == "sigmoid"
    mixtral = PRESETS["mixtral-8x7b"]
    assert mixtral.expert_ffn_hidden == 14336
    first, block, last = LLaMA3.parameter_parts(mixtral)  # what the memory plan counts: every expert
    assert round((first + mixtral.n_layer * block + last) / 1e8) == 467  # Mixtral 8x7B's 46.7B
    assert round(LLaMA3.active_parameters(mixtral) / 1e8) == 129  # and its 12.9B per token (MFU)
    model = LLaMA3(CFG, seed=1)
    assert LLaMA3.active_parameters(CFG) < model.num_parameters()
    first, block, last = LLaMA3.parameter_parts(CFG)  # a block: the mean of the dense and MoE ones
    assert abs(first + CFG.n_layer * block + last - model.num_parameters()) < CFG.n_layer


def test_llmc_refuses_experts(tmp_path):
    with pytest.raises(ValueError, match="llm.c LLaMA-3 format has no experts"):
        LLaMA3(CFG, seed=1).save_llmc(tmp_path / "m.bin")


def test_moe_checkpoint_into_dense_model_is_a_clear_error(tmp_path):
    save_checkpoint(tmp_path / "moe", 1, LLaMA3(CFG, seed=1))
    with pytest.raises(CheckpointError, match="mixture-of-experts layers .* where this one has dense MLPs"):
        load_checkpoint(tmp_path / "moe", LLaMA3(replace(CFG, num_experts=0), seed=1))
    dense_root = tmp_path / "dense"
    save_checkpoint(dense_root, 1, LLaMA3(replace(CFG, num_experts=0), seed=1))
    with pytest.raises(CheckpointError, match="this model has mixture-of-experts layers"):
        load_checkpoint(dense_root, LLaMA3(CFG, seed=1))


def test_lora_adapts_attention_and_refuses_routed_experts():
    from infinitrain.nn.lora import apply_lora
    assert apply_lora(LLaMA3(CFG, seed=1), 2, targets=("c_attn", "shared_experts.up_proj")) == [
        "transformer.h.0.attn.c_attn", "transformer.h.0.mlp.shared_experts.up_proj",
        "transformer.h.1.attn.c_attn", "transformer.h.2.attn.c_attn", "transformer.h.2.mlp.shared_experts.up_proj"]
    with pytest.raises(ValueError, match="LoRA cannot adapt a mixture-of-experts layer's router or routed experts"):
        apply_lora(LLaMA3(CFG, seed=1), 2, targets=("gate_proj",))


@pytest.mark.slow
def test_llama3_example_trains_experts(tmp_path):
    from infinitrain.data import write_shard
    from helpers import example, step_losses
    write_shard(tmp_path / "train.bin", np.tile(np.random.default_rng(0).integers(0, 300, 64), 40))
    out = example(1, "llama3", ["--input_bin", tmp_path / "train.bin", "--model", "tiny", "--num_experts", "4",
                                "--moe_top_k", "2", "--moe_aux_loss_coeff", "0.01", "--moe_router", "sigmoid",
                                "--moe_bias_update_rate", "0.01", "--moe_log_every", "2", "--batch_size", "2",
                                "--sequence_length", "32", "--num_iteration", "4", "--learning_rate", "3e-3"])
    losses = step_losses(out)
    assert len(losses) == 4 and losses[-1] < losses[0], out
    assert "experts: 4 of width" in out and "| aux " in out and "imbalance " in out
    assert out.count("tokens per expert:") == 2 * 2  # steps 2 and 4, two layers


def test_checkpoint_keeps_experts_and_selection_biases(tmp_path):
    cfg = replace(CFG, moe_router="sigmoid", moe_bias_update_rate=0.01)
    model = LLaMA3(cfg, seed=1)
    x, y = batch(3)
    model(x, y)[1].backward()
    model.update_moe_biases()
    save_checkpoint(tmp_path, 1, model)
    again = LLaMA3(cfg, seed=9)
    load_checkpoint(tmp_path, again)
    want = model.state_dict()
    assert "transformer.h.0.mlp.gate.e_score_correction_bias" in want
    for name, t in again.state_dict().items():
        np.testing.assert_array_equal(t.numpy(), want[name].numpy(), err_msg=name)

