"""LoRA: a run with adapters equals the same run written by hand (base frozen, an explicit
low-rank update added to each target layer's output); merging gives the unmerged logits;
adapters save and load alone; and DP / TP (+SP) / PP runs with adapters equal one process's
(fp32 within 1e-5, bf16 within 1e-2), their saved adapters too."""

import numpy as np
import pytest
from safetensors.numpy import load_file

import infinitrain as it
from infinitrain.checkpoint import CheckpointError, load_lora, save_lora
from infinitrain.models import GPT2Config, LLaMA3Config
from infinitrain.models.gpt2 import GPT2
from infinitrain.models.llama3 import LLaMA3
from infinitrain.nn.lora import apply_lora, merge_lora, unmerge_lora
from infinitrain.optim import AdamW
from helpers import BatchedRuns, assert_same, example, losses


def tiny(kind="gpt2"):
    if kind == "gpt2":
        return GPT2(GPT2Config(block_size=32, vocab_size=300, n_layer=2, n_head=4, n_embd=32), seed=5)
    return LLaMA3(LLaMA3Config(block_size=32, vocab_size=300, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
                               ffn_dim_multiplier=None, multiple_of=32, rope_theta=10000.0), seed=5)


def batch(step):
    data = np.random.default_rng(step % 2).integers(0, 300, (4, 17))
    return it.from_numpy(data[:, :-1].copy()), it.from_numpy(data[:, 1:].copy())


def train(model, params, steps=5):
    opt = AdamW(params, lr=1e-2, weight_decay=0.0)
    out = []
    for step in range(steps):
        _, loss = model(*batch(step), return_logits=False)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


@pytest.mark.parametrize("kind", ["gpt2", "llama3"])
def test_lora_equals_an_explicit_low_rank_update_written_by_hand(kind):
    lora = tiny(kind)
    names = apply_lora(lora, 4, alpha=8, seed=3)
    start = {n: p.detach().numpy().copy() for n, p in lora.named_parameters()}
    got = train(lora, [p for p in lora.parameters() if p.requires_grad])

    by_hand = tiny(kind)
    for p in by_hand.parameters():
        p.requires_grad = False
    adapters = []
    for name in names:  # the same starting adapters, added by a forward hook as x Aᵀ Bᵀ · 8/4
        A = it.from_numpy(start[name + ".lora_A"].copy()).requires_grad_()
        B = it.from_numpy(start[name + ".lora_B"].copy()).requires_grad_()
        adapters += [A, B]
        layer = dict(by_hand.named_modules())[name]
        layer.register_forward_hook(lambda m, args, out, A=A, B=B: out + (args[0] @ A.t()) @ B.t() * 2.0)
    want = train(by_hand, adapters)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got[-1] < got[0] - 0.05, got  # it learns
    for n, p in lora.named_parameters():  # the base did not move; the adapters did
        moved = not np.array_equal(p.detach().numpy(), start[n])
        assert moved == ("lora_" in n), n
    assert sorted({n.split(".", 3)[-1] for n in names}) == sorted(
        {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"} | ({"mlp.c_fc2"} if kind == "llama3" else set()))


def test_merge_gives_the_unmerged_logits_and_unmerge_restores_the_weights():
    model = tiny()
    apply_lora(model, 4, alpha=8, seed=3)
    train(model, [p for p in model.parameters() if p.requires_grad], steps=3)
    x, _ = batch(0)
    with it.no_grad():
        before = model(x)[0].numpy().copy()
        weights = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
        merge_lora(model)
        merged = model(x)[0].numpy().copy()
        assert any(not np.array_equal(p.detach().numpy(), weights[n]) for n, p in model.named_parameters())
        unmerge_lora(model)
        after = model(x)[0].numpy()
    np.testing.assert_allclose(merged, before, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)
    for n, p in model.named_parameters():
        np.testing.assert_allclose(p.detach().numpy(), weights[n], rtol=1e-6, atol=1e-7, err_msg=n)


def test_adapters_save_and_load_alone(tmp_path):
    model = tiny()
    apply_lora(model, 4, seed=3)
    train(model, [p for p in model.parameters() if p.requires_grad], steps=2)
    save_lora(model, tmp_path / "a")
    stored = load_file(str(tmp_path / "a" / "adapter_model.safetensors"))
    assert stored and all(k.endswith((".lora_A.weight", ".lora_B.weight")) for k in stored), sorted(stored)
    fresh = tiny()
    apply_lora(fresh, 4, seed=99)  # other starting adapters, then the saved ones
    load_lora(fresh, tmp_path / "a")
    x, _ = batch(1)
    with it.no_grad():
        np.testing.assert_array_equal(fresh(x)[0].numpy(), model(x)[0].numpy())
    other = tiny()
    apply_lora(other, 2)
    with pytest.raises(CheckpointError, match="the adapter of .* is rank 4"):
        load_lora(other, tmp_path / "a")
    with pytest.raises(CheckpointError, match="no adapter_config"):
        load_lora(fresh, tmp_path / "nothing")
    (tmp_path / "a" / "adapter_model.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(CheckpointError, match="is not a safetensors file"):
        load_lora(fresh, tmp_path / "a")
    with pytest.raises(ValueError, match="no linear layer matches"):
        apply_lora(tiny(), 4, targets=["nope"])
    with pytest.raises(ValueError, match="positive integer"):
        apply_lora(tiny(), 0)


LAYOUTS = [
    ("gpt2", 2, [], "float32"),
    ("gpt2", 4, ["--tp", "2", "--sp", "--micro", "2"], "float32"),
    ("llama3", 4, ["--tp", "4"], "float32"),
    ("llama3", 4, ["--tp", "2", "--sp", "--zero", "2", "--micro", "2"], "float32"),
    ("gpt2", 2, ["--zero", "3", "--micro", "2"], "float32"),  # only the adapters are sharded
    ("gpt2", 8, ["--tp", "2", "--pp", "2", "--micro", "2"], "float32"),
    ("llama3", 8, ["--tp", "2", "--sp", "--pp", "2", "--vpp", "2", "--layers", "4", "--micro", "4"], "float32"),
    ("gpt2", 4, ["--tp", "2", "--sp", "--micro", "2"], "bfloat16"),
]


def _lora_flags(model, flags, dtype):
    """(the one-process run's flags, the layout's own)."""
    layers = flags[flags.index("--layers") + 1] if "--layers" in flags else "2"
    common = ["--model", model, "--lora", "4", "--steps", "5", "--batch", "8", "--layers", layers,
              "--dtype", dtype, "--lr", "1e-2" if dtype == "float32" else "3e-3"]
    return common, [f for i, f in enumerate(flags) if f != "--layers" and (i == 0 or flags[i - 1] != "--layers")]


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory):
    """Each layout's run, saving its adapters in a folder of its own, as one job per rank count;
    each one-process reference (a model, its layers and dtype) once: (n, flags, dtype) -> the
    run's output and folder, and the reference's."""
    root = tmp_path_factory.mktemp("lora")
    refs, runs = {}, []
    for i, (model, n, flags, dtype) in enumerate(LAYOUTS):
        common, rest = _lora_flags(model, flags, dtype)
        refs.setdefault(tuple(common), root / f"one-{len(refs)}")
        runs.append((n, common + rest + ["--lora_save", str(root / f"par-{i}")]))
    batched = BatchedRuns([(1, list(c) + ["--lora_save", str(d)]) for c, d in refs.items()] + runs)

    def result(model, n, flags, dtype):
        common, rest = _lora_flags(model, flags, dtype)
        one = refs[tuple(common)]
        i = LAYOUTS.index((model, n, flags, dtype))
        return (batched(1, common + ["--lora_save", str(one)]), one,
                batched(n, common + rest + ["--lora_save", str(root / f"par-{i}")]), root / f"par-{i}")
    return result


@pytest.mark.mpi
@pytest.mark.parametrize("model,n,flags,dtype", LAYOUTS)
def test_lora_in_parallel_layouts_matches_one_process(model, n, flags, dtype, lora_runs):
    ref_out, ref_dir, par_out, par_dir = lora_runs(model, n, flags, dtype)
    assert_same(losses(par_out), losses(ref_out), dtype, f"{model} LoRA {' '.join(flags) or 'DP 2'} {dtype}")
    if dtype == "float32":  # the adapters they end with, gathered to one-process tensors
        one = {}
        for f in ref_dir.glob("*.safetensors"):
            one.update(load_file(str(f)))
        par = {}
        for f in par_dir.glob("*.safetensors"):
            par.update(load_file(str(f)))
        assert sorted(one) == sorted(par)
        for k in one:  # a misplaced shard would be off by O(1); AdamW's round-off is ~1e-4 of an element
            assert np.linalg.norm(par[k] - one[k]) <= 1e-3 * np.linalg.norm(one[k]), k


@pytest.mark.mpi
def test_example_lora_flags_save_and_resume_adapters(tmp_path):
    """--lora_rank trains adapters only and saves them; --lora_load_path starts from them under
    another layout (TP 2), taking rank and alpha from the saved config."""
    from infinitrain.data import write_shard
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 300), 40))
    args = ["--input_bin", tmp_path / "t.bin", "--model", "tiny", "--batch_size", "2", "--sequence_length", "32",
            "--learning_rate", "1e-2"]
    one = example(1, "gpt2", args + ["--num_iteration", "3", "--lora_rank", "4", "--lora_alpha", "8",
                                     "--lora_save_path", tmp_path / "ad"], check=False)
    assert one.returncode == 0, one.stderr
    assert "LoRA: rank 4, alpha 8 on 8 layers" in one.stdout and "trainable of" in one.stdout, one.stdout
    tp = example(2, "gpt2", args + ["--num_iteration", "1", "--tensor_parallel", "2",
                                    "--lora_load_path", tmp_path / "ad"], check=False)
    single = example(1, "gpt2", args + ["--num_iteration", "1", "--lora_load_path", tmp_path / "ad"], check=False)
    assert tp.returncode == 0 and single.returncode == 0, tp.stderr + single.stderr
    pick = lambda out: float(out.split("train loss ")[1].split()[0])  # noqa: E731
    assert abs(pick(tp.stdout) - pick(single.stdout)) <= 1e-5 * pick(single.stdout)
    assert pick(single.stdout) < float(one.stdout.split("train loss ")[1].split()[0])  # trained adapters
    bad = example(1, "gpt2", args + ["--num_iteration", "1", "--lora_rank", "4", "--lora_target_modules", "wq"],
                  check=False)
    assert bad.returncode != 0 and "cannot set up LoRA: no linear layer matches" in bad.stderr, bad.stderr
