"""Hugging Face transformers' format both ways, against transformers itself (the compare
extra): what save_pretrained writes loads as GPT2LMHeadModel / LlamaForCausalLM with the same
logits, what transformers writes (one file, shards with an index, bf16) loads here with the same
logits, and a folder that is not what its config says is refused before anything is built."""
import json

import numpy as np
import pytest

import infinitrain as it
from infinitrain.io import DataFormatError
from infinitrain.models import GPT2, LLaMA3, gpt2, llama3

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

IDX = np.random.default_rng(0).integers(0, 50257, (2, 16))
MODELS = {
    "gpt2": (GPT2, lambda: gpt2("tiny")),
    "llama3": (LLaMA3, lambda: llama3("tiny")),
    "llama3.1-rope": (LLaMA3, lambda: llama3("tiny", use_scaled_rope=True, rope_scaling_factor=8.0)),
    # Qwen3: QK-norm, and heads wider than the width / heads (as Qwen3-30B-A3B's); its norms'
    # weights drawn away from one so that their permutation is seen
    "qwen3": (LLaMA3, lambda: _jitter_norms(llama3("tiny", head_size=32, qk_norm=True))),
    # the mixtures: Mixtral (every layer, the chosen weights renormalised) and Qwen3-MoE (every
    # other layer here, the chosen weights as the softmax gave them)
    "mixtral": (LLaMA3, lambda: llama3("moe-tiny")),
    "qwen3_moe": (LLaMA3, lambda: _jitter_norms(llama3("moe-tiny", head_size=32, qk_norm=True, moe_layer_freq=2,
                                                       moe_norm_topk_prob=False))),
}
ARCHITECTURE = {"gpt2": "GPT2LMHeadModel", "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM",
                "qwen3_moe": "Qwen3MoeForCausalLM"}


def _jitter_norms(model):
    with it.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_norm.weight"):
                p.copy_(it.tensor(1 + 0.3 * np.random.default_rng(len(name)).standard_normal(p.shape),
                                  dtype=it.float32))
    return model


def _ours(model) -> np.ndarray:
    return model(it.tensor(IDX))[0].detach().numpy()[..., :model.config.vocab_size]


def _theirs(folder, **kw) -> tuple:
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kw).eval()
    with torch.no_grad():
        return hf, hf(torch.tensor(IDX)).logits.numpy()


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_both_directions_give_the_same_logits(tmp_path, name):
    cls, make = MODELS[name]
    it.manual_seed(1)
    model = make()
    model.save_pretrained(tmp_path / "ours")
    hf, theirs = _theirs(tmp_path / "ours")
    assert type(hf).__name__ == ARCHITECTURE.get(name, "LlamaForCausalLM")
    np.testing.assert_allclose(theirs, _ours(model), rtol=0, atol=1e-5)
    hf.save_pretrained(tmp_path / "theirs")  # transformers' own writing, read back here
    np.testing.assert_allclose(_ours(cls.from_pretrained(tmp_path / "theirs")), theirs, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_sharded_bf16_and_tied_checkpoints_written_by_transformers_load(tmp_path):
    """A LLaMA with a tied head (as LLaMA-3.2 1B/3B), written by transformers in bfloat16 as
    shards with model.safetensors.index.json."""
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   tie_word_embeddings=True, rope_theta=500000.0)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    idx = IDX % 512
    with torch.no_grad():
        theirs = hf.float()(torch.tensor(idx)).logits.numpy()
    ours = LLaMA3.from_pretrained(tmp_path)
    assert ours.config.ffn_hidden == 160 and ours.config.rope_theta == 500000.0
    np.testing.assert_allclose(ours(it.tensor(idx))[0].detach().numpy()[..., :512], theirs, rtol=0, atol=1e-5)


def _saved(tmp_path, name="gpt2"):
    it.manual_seed(0)
    MODELS[name][1]().save_pretrained(tmp_path)
    return json.loads((tmp_path / "config.json").read_text())


@pytest.mark.parametrize("edit,message", [
    (lambda c: c.__setitem__("n_layer", 2**30), "n_layer must be an integer in"),
    (lambda c: c.__setitem__("n_layer", 100000), "missing transformer.h.2"),  # (once: 6 GB allocated first)
    (lambda c: c.__setitem__("n_embd", "64"), "n_embd must be an integer"),
    (lambda c: c.__setitem__("n_layer", 3), "missing transformer.h.2"),
    (lambda c: c.__setitem__("n_embd", 128), "transformer.wte.weight is (50257, 64), the config says (50257, 128)"),
    (lambda c: c.__setitem__("activation_function", "relu"), "differs from the one infinitrain builds"),
    (lambda c: c.__setitem__("model_type", "bert"), "holds a bert, not a GPT2"),
], ids=["n_layer-2^30", "n_layer-100000", "n_embd-string", "n_layer-3", "n_embd-128", "relu", "bert"])
def test_a_config_that_does_not_match_its_weights_is_refused_before_building(tmp_path, edit, message):
    config = _saved(tmp_path)
    edit(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    it.reset_peak_memory_stats()
    before = it.memory_stats()["allocated_bytes"]  # (the saved model may not be collected yet)
    with pytest.raises((DataFormatError, Exception), match=message.replace("(", r"\(").replace(")", r"\)")):
        GPT2.from_pretrained(tmp_path)
    assert it.memory_stats()["peak_allocated_bytes"] - before < 2**20  # nothing was built


def test_broken_files_are_named(tmp_path):
    _saved(tmp_path)
    weights = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(weights[:len(weights) // 2])
    with pytest.raises(DataFormatError, match=r"does not fit its bytes .*\(truncated\?\)"):
        GPT2.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(DataFormatError, match="config.json is not valid JSON"):
        GPT2.from_pretrained(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../elsewhere"}}))
    _saved(tmp_path / "again")
    (tmp_path / "again" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../x"}}))
    with pytest.raises(DataFormatError, match="which is not a file of"):
        GPT2.from_pretrained(tmp_path / "again")


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("name", ["gpt2", "llama3"])
def test_the_examples_start_from_and_end_as_a_transformers_folder(tmp_path, name):
    """--save_pretrained writes the trained model (the checkpoint's weights) as a folder
    transformers loads; --from_pretrained starts from one, and at TP 2 trains as one process does
    (same losses, same exported weights)."""
    import re
    from safetensors.numpy import load_file
    from infinitrain.checkpoint import load_checkpoint
    from infinitrain.data import write_shard
    from helpers import example
    cls = MODELS[name][0]
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 300), 40))
    common = ["--input_bin", tmp_path / "t.bin", "--model", "tiny", "--batch_size", "2", "--sequence_length", "32",
              "--num_iteration", "2", "--learning_rate", "3e-3"]
    example(1, name, [*common, "--save", tmp_path / "ck", "--save_pretrained", tmp_path / "hf1"])
    exported, trained = cls.from_pretrained(tmp_path / "hf1"), MODELS[name][1]()
    load_checkpoint(tmp_path / "ck", trained)
    for (k, a), b in zip(exported.state_dict().items(), trained.state_dict().values()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf1")
    assert loaded.config.model_type == ("gpt2" if name == "gpt2" else "llama")
    runs = {}
    for ranks, layout in ((1, []), (2, ["--tensor_parallel", "2"])):
        out = example(ranks, name, [*common, "--from_pretrained", tmp_path / "hf1",
                                    "--save_pretrained", tmp_path / f"hf{ranks + 1}", *layout])
        assert f"{tmp_path / 'hf1'}" in out
        runs[ranks] = [float(v) for v in re.findall(r"train loss (\S+)", out)]
    np.testing.assert_allclose(runs[2], runs[1], rtol=1e-5)
    one, two = (load_file(str(tmp_path / f / "model.safetensors")) for f in ("hf2", "hf3"))
    assert one.keys() == two.keys()
    for k in one:  # (atol: Adam turns round-off into steps where the exact gradient is 0, GPT-2's key bias)
        np.testing.assert_allclose(two[k], one[k], rtol=1e-4, atol=1e-4, err_msg=k)


@pytest.mark.slow
def test_llama_trains_step_for_step_as_transformers_llama(tmp_path):
    """LLaMA's training step is PyTorch's: from the same weights (save_pretrained, loaded as
    LlamaForCausalLM), the same batches and AdamW without warm-up at a rate high enough that the
    loss climbs above the first step's (the shape of the LLaMA-3.2-1B GPU run's rise at lr 1e-4,
    docs/cuda.md), every step's loss agrees to float32 round-off: the climb is the optimizer's,
    in both."""
    it.manual_seed(1)
    model = llama3("tiny")
    model.save_pretrained(tmp_path / "w")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "w", dtype=torch.float32)
    adamw = dict(lr=5e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    ours_opt, theirs_opt = it.optim.AdamW(model.parameters(), **adamw), torch.optim.AdamW(hf.parameters(), **adamw)
    rng, ours, theirs = np.random.default_rng(0), [], []
    for _ in range(8):
        batch = rng.integers(0, model.config.vocab_size, (4, 33))
        x, y = batch[:, :-1], batch[:, 1:]
        _, loss = model(it.tensor(x), it.tensor(y))
        loss.backward()
        ours_opt.step()
        ours_opt.zero_grad()
        ours.append(loss.item())
        logits = hf(torch.tensor(x)).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.tensor(y).reshape(-1))
        loss.backward()
        theirs_opt.step()
        theirs_opt.zero_grad()
        theirs.append(loss.item())
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    assert max(theirs[1:]) > theirs[0] + 0.05, theirs  # the rate is past where the loss falls at once
