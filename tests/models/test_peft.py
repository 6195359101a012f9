"""LoRA adapters in Hugging Face PEFT's format, both ways, and the merge command: what save_lora
writes, PeftModel.from_pretrained applies to the base save_pretrained writes with the same
logits (GPT-2's Conv1D with fan_in_fan_out; LLaMA's fused q/k/v as three adapters sharing A,
rotary rows permuted); what PEFT writes (its own initialisation, q and v with different A's,
rank_pattern and alpha_pattern) loads here with the same logits and saves back; and the merged
folder `python -m infinitrain.lora merge` writes gives the base + adapter logits in plain
transformers. Without PEFT (the compare extra) the format is checked against PEFT's merge
arithmetic: merged weights - base weights = (alpha / r) B A for every module the file names."""
import json

import numpy as np
import pytest
from safetensors.numpy import load_file

import infinitrain as it
from infinitrain import lora as lora_cli
from infinitrain.checkpoint import CheckpointError, load_lora, save_lora, save_pretrained
from infinitrain.models import GPT2, GPT2Config, LLaMA3, LLaMA3Config
from infinitrain.nn.lora import apply_lora, lora_layers

IDX = np.random.default_rng(0).integers(0, 300, (2, 16))
CLASSES = {"gpt2": GPT2, "llama3": LLaMA3}


def tiny(kind):
    if kind == "gpt2":
        return GPT2(GPT2Config(block_size=32, vocab_size=300, n_layer=2, n_head=4, n_embd=32), seed=5)
    return LLaMA3(LLaMA3Config(block_size=32, vocab_size=300, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
                               ffn_dim_multiplier=None, multiple_of=32, rope_theta=10000.0), seed=5)


def adapted(kind, tmp_path):
    """A tiny model with rank-4 adapters (alpha 8) whose B is far from zero, saved as a
    transformers base (tmp_path/base) and PEFT adapters (tmp_path/ad)."""
    model = tiny(kind)
    apply_lora(model, 4, alpha=8, seed=3)
    rng = np.random.default_rng(1)
    with it.no_grad():
        for _, layer in lora_layers(model):
            layer.lora_B.copy_(it.from_numpy(rng.standard_normal(tuple(layer.lora_B.shape)).astype(np.float32) / 8))
    save_pretrained(model, tmp_path / "base")
    save_lora(model, tmp_path / "ad", base_model=str(tmp_path / "base"))
    return model


def ours(model):
    with it.no_grad():
        return model(it.tensor(IDX))[0].numpy()[..., :300]


@pytest.mark.parametrize("kind", ["gpt2", "llama3"])
def test_the_files_are_peft_s_and_merging_them_is_peft_s_arithmetic(kind, tmp_path):
    model = adapted(kind, tmp_path)
    config = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert (config["peft_type"], config["task_type"], config["r"], config["lora_alpha"], config["bias"]) == \
        ("LORA", "CAUSAL_LM", 4, 8.0, "none")
    assert config["fan_in_fan_out"] is (kind == "gpt2")
    assert config["base_model_name_or_path"] == str(tmp_path / "base")
    assert config["target_modules"] == (["c_attn", "c_fc", "c_proj"] if kind == "gpt2" else
                                        ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"])
    adapters = load_file(str(tmp_path / "ad" / "adapter_model.safetensors"))
    base = load_file(str(tmp_path / "base" / "model.safetensors"))
    save_pretrained(model, tmp_path / "merged", merge_lora=True)
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    modules = sorted({n.rsplit(".lora_", 1)[0] for n in adapters})
    assert len(modules) == 2 * (4 if kind == "gpt2" else 7)
    for module in modules:  # base_model.model.<module>.lora_A.weight [r, in], lora_B.weight [out, r]
        A, B = adapters[module + ".lora_A.weight"], adapters[module + ".lora_B.weight"]
        name = module.removeprefix("base_model.model.") + ".weight"
        delta = merged[name] - base[name]
        want = B @ A * 2.0
        np.testing.assert_allclose(delta.T if kind == "gpt2" else delta, want, rtol=0, atol=1e-5, err_msg=name)
        assert np.abs(want).max() > 1e-2
    untouched = [n for n in base if not any(n == m.removeprefix("base_model.model.") + ".weight" for m in modules)]
    assert all(np.array_equal(base[n], merged[n]) for n in untouched)
    # read back here, into a model without adapters (applied as the file says) and one with
    fresh = CLASSES[kind].from_pretrained(tmp_path / "base")
    assert sorted(load_lora(fresh, tmp_path / "ad")) == sorted(n for n, _ in lora_layers(model))
    np.testing.assert_allclose(ours(fresh), ours(model), rtol=0, atol=1e-5)
    other = tiny(kind)
    apply_lora(other, 4, alpha=2, seed=9)  # another alpha: B is rescaled to it
    load_lora(other, tmp_path / "ad")
    np.testing.assert_allclose(ours(other), ours(model), rtol=0, atol=1e-5)
    third = tiny(kind)
    load_lora(third, tmp_path / "ad", alpha=1.0)  # (--lora_alpha with PEFT's adapters)
    assert third.lora_config["lora_alpha"] == 1.0
    np.testing.assert_allclose(ours(third), ours(model), rtol=0, atol=1e-5)


def test_adapters_that_are_not_plain_lora_or_do_not_fit_are_refused(tmp_path):
    adapted("llama3", tmp_path)
    config = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    for edit, message in [({"use_dora": True}, "use_dora=True is not plain LoRA"),
                          ({"bias": "all"}, "bias='all' is not plain LoRA"),
                          ({"peft_type": "IA3"}, "'IA3' adapters")]:
        (tmp_path / "ad" / "adapter_config.json").write_text(json.dumps({**config, **edit}))
        with pytest.raises(CheckpointError, match=message):
            load_lora(tiny("llama3"), tmp_path / "ad")
    (tmp_path / "ad" / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="PEFT adapts .*embed_tokens, which infinitrain's LLaMA3 cannot"):
        save_file_with(tmp_path / "ad", {"base_model.model.model.embed_tokens.lora_A.weight": np.zeros((4, 300)),
                                         "base_model.model.model.embed_tokens.lora_B.weight": np.zeros((32, 4))})
        load_lora(tiny("llama3"), tmp_path / "ad")
    adapted("gpt2", tmp_path / "g")
    model = tiny("gpt2")
    apply_lora(model, 4, targets=["c_attn"])  # adapters on c_attn only: the file has more
    with pytest.raises(CheckpointError, match="adapts other layers than this model: it adapts .*c_proj"):
        load_lora(model, tmp_path / "g" / "ad")
    lm_head = tiny("gpt2")
    apply_lora(lm_head, 2, targets=["lm_head"])
    with pytest.raises(CheckpointError, match="lm_head has no counterpart in PEFT's format"):
        save_lora(lm_head, tmp_path / "head")


def save_file_with(folder, extra):
    from safetensors.numpy import save_file
    tensors = {**load_file(str(folder / "adapter_model.safetensors")),
               **{k: v.astype(np.float32) for k, v in extra.items()}}
    save_file(tensors, str(folder / "adapter_model.safetensors"))


def test_only_some_of_q_k_v_and_a_partial_target_list(tmp_path):
    """PEFT's usual LLaMA targets (q_proj, v_proj) with their own A's load as one fused adapter
    of twice the rank, exactly; adapters on a few layers name them in target_modules."""
    model = adapted("llama3", tmp_path)
    files = load_file(str(tmp_path / "ad" / "adapter_model.safetensors"))
    rng = np.random.default_rng(2)
    kept = {k: (rng.standard_normal(v.shape).astype(np.float32) / 8 if ".q_proj.lora_A" in k else v)
            for k, v in files.items() if ".q_proj." in k or ".v_proj." in k}
    from safetensors.numpy import save_file
    save_file(kept, str(tmp_path / "ad" / "adapter_model.safetensors"))
    fresh = CLASSES["llama3"].from_pretrained(tmp_path / "base")
    load_lora(fresh, tmp_path / "ad")
    assert fresh.lora_config["ranks"] == {"transformer.h.0.attn.c_attn": 8, "transformer.h.1.attn.c_attn": 8}
    save_lora(fresh, tmp_path / "back")
    back = json.loads((tmp_path / "back" / "adapter_config.json").read_text())
    assert back["rank_pattern"]["model.layers.1.self_attn.k_proj"] == 8
    assert back["alpha_pattern"]["model.layers.1.self_attn.k_proj"] == 16.0  # the scale stays 8 / 4
    again = tiny("llama3")
    load_lora(again, tmp_path / "back")
    np.testing.assert_allclose(ours(again), ours(fresh), rtol=0, atol=1e-5)
    assert np.abs(ours(fresh) - ours(model)).max() > 1e-3  # (k's adapter went: the logits moved)
    few = tiny("gpt2")
    apply_lora(few, 2, targets=["h.1.attn.c_proj", "h.0.mlp.c_fc"])
    save_lora(few, tmp_path / "few")
    targets = json.loads((tmp_path / "few" / "adapter_config.json").read_text())["target_modules"]
    assert targets == ["transformer.h.0.mlp.c_fc", "transformer.h.1.attn.c_proj"]


def test_merge_command_gives_the_base_plus_adapter_logits(tmp_path):
    model = adapted("llama3", tmp_path)
    (tmp_path / "base" / "tokenizer.json").write_text("{}")
    lora_cli.main(["merge", "--adapter", str(tmp_path / "ad"), "--out", str(tmp_path / "merged")])
    assert (tmp_path / "merged" / "tokenizer.json").is_file()
    merged = LLaMA3.from_pretrained(tmp_path / "merged")
    assert not lora_layers(merged)
    np.testing.assert_allclose(ours(merged), ours(model), rtol=0, atol=1e-5)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8,
                                                                      "target_modules": ["c_attn"]}))
    with pytest.raises(SystemExit, match="earlier format"):
        lora_cli.main(["merge", "--adapter", str(tmp_path / "old"), "--out", str(tmp_path / "m2"),
                       "--base", str(tmp_path / "base")])


# ---- against PEFT and transformers themselves (the compare extra) --------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt2", "llama3"])
def test_peft_applies_what_infinitrain_writes_and_the_merged_folder_in_transformers(kind, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    model = adapted(kind, tmp_path)
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32)
    with torch.no_grad():
        plain = base(torch.tensor(IDX)).logits.numpy()
        theirs = peft.PeftModel.from_pretrained(base, tmp_path / "ad").eval()(torch.tensor(IDX)).logits.numpy()
    np.testing.assert_allclose(theirs, ours(model), rtol=0, atol=1e-5)
    assert np.abs(theirs - plain).max() > 1e-2  # the adapters matter
    lora_cli.main(["merge", "--adapter", str(tmp_path / "ad"), "--out", str(tmp_path / "merged")])
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    with torch.no_grad():
        np.testing.assert_allclose(merged(torch.tensor(IDX)).logits.numpy(), theirs, rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt2", "llama3"])
def test_adapters_peft_writes_load_here_and_save_back(kind, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    save_pretrained(tiny(kind), tmp_path / "base")
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32)
    torch.manual_seed(0)
    if kind == "gpt2":
        config = peft.LoraConfig(r=4, lora_alpha=16, target_modules=["c_attn", "mlp.c_proj"], fan_in_fan_out=True,
                                 init_lora_weights=False, rank_pattern={"h.1.attn.c_attn": 2}, use_rslora=True,
                                 task_type="CAUSAL_LM")  # rsLoRA: alpha / sqrt(r)
    else:  # q and v with their own A's, down_proj of another rank, v of another alpha
        config = peft.LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"],
                                 init_lora_weights=False, rank_pattern={"down_proj": 2}, alpha_pattern={"v_proj": 3},
                                 task_type="CAUSAL_LM")
    peft_model = peft.get_peft_model(base, config).eval()  # init_lora_weights=False: B is not zero
    with torch.no_grad():
        theirs = peft_model(torch.tensor(IDX)).logits.numpy()
    peft_model.save_pretrained(tmp_path / "theirs")
    model = CLASSES[kind].from_pretrained(tmp_path / "base")
    load_lora(model, tmp_path / "theirs")
    np.testing.assert_allclose(ours(model), theirs, rtol=0, atol=1e-5)
    save_lora(model, tmp_path / "back")
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32)
    with torch.no_grad():
        back = peft.PeftModel.from_pretrained(base, tmp_path / "back").eval()(torch.tensor(IDX)).logits.numpy()
    np.testing.assert_allclose(back, theirs, rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.mpi
def test_the_example_trains_adapters_that_peft_applies_on_one_and_two_ranks(tmp_path):
    """--lora_rank with --save_pretrained and --lora_save_path: the base and PEFT adapters that
    name it, the same from one process and from TP 2; PEFT applies them with the logits
    infinitrain gives, and the merge command folds them in."""
    from infinitrain.data import write_shard
    from helpers import example
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 300), 40))
    common = ["--input_bin", tmp_path / "t.bin", "--model", "tiny", "--batch_size", "2", "--sequence_length", "32",
              "--num_iteration", "3", "--learning_rate", "1e-2", "--lora_rank", "4", "--lora_alpha", "8"]
    for ranks, layout in ((1, []), (2, ["--tensor_parallel", "2"])):
        example(ranks, "llama3", [*common, *layout, "--save_pretrained", tmp_path / f"base{ranks}",
                                  "--lora_save_path", tmp_path / f"ad{ranks}"])
    config = json.loads((tmp_path / "ad2" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((tmp_path / "base2").resolve())
    one, two = (load_file(str(tmp_path / f"ad{r}" / "adapter_model.safetensors")) for r in (1, 2))
    assert sorted(one) == sorted(two)
    for k in one:  # AdamW's round-off is ~1e-4 of an element; a misplaced shard would be off by O(1)
        assert np.linalg.norm(two[k] - one[k]) <= 1e-3 * np.linalg.norm(one[k]), k
    model = LLaMA3.from_pretrained(tmp_path / "base2")
    load_lora(model, tmp_path / "ad2")
    lora_cli.main(["merge", "--adapter", str(tmp_path / "ad2"), "--out", str(tmp_path / "merged")])
    idx = IDX % model.config.vocab_size
    with it.no_grad():
        want = model(it.tensor(idx))[0].numpy()[..., :model.config.vocab_size]
        np.testing.assert_allclose(LLaMA3.from_pretrained(tmp_path / "merged")(it.tensor(idx))[0].numpy()
                                   [..., :model.config.vocab_size], want, rtol=0, atol=1e-5)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base2", dtype=torch.float32)
    with torch.no_grad():
        theirs = peft.PeftModel.from_pretrained(base, tmp_path / "ad2").eval()(torch.tensor(idx)).logits.numpy()
    np.testing.assert_allclose(theirs, want, rtol=0, atol=1e-5)
