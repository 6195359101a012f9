"""GPT-2: overfitting one batch, llm.c checkpoints, and the example end to end."""
import re

import numpy as np
import pytest

import infinitrain as it
from infinitrain.data import DataFormatError, write_shard, write_tokenizer
from infinitrain.models import GPT2, gpt2
from helpers import example


def test_logits_and_padded_vocab():
    it.manual_seed(0)
    model = gpt2("tiny")
    assert model.transformer.wte.weight.shape == (50304, 64)
    assert np.all(model.transformer.wte.weight.detach().numpy()[50257:] == 0)
    logits, loss = model(it.tensor([[1, 2, 3]]))
    assert logits.shape == (1, 3, 50257) and loss is None
    with pytest.raises(ValueError, match="block size"):
        model(it.zeros(1, 300, dtype=it.int64))


@pytest.mark.parametrize("version", [3, 5])
def test_llmc_checkpoint_round_trip(tmp_path, version):
    it.manual_seed(1)
    model = gpt2("tiny", n_layer=3)
    model.save_llmc(tmp_path / "m.bin", version=version)
    header = np.fromfile(tmp_path / "m.bin", dtype="<i4", count=8)
    assert header.tolist() == [20240326, version, 256, 50257, 3, 2, 64, 50304]
    loaded = GPT2.from_llmc(tmp_path / "m.bin")
    for (n, a), (_, b) in zip(model.named_parameters(), loaded.named_parameters()):
        ref = a.detach().numpy() if version == 3 else a.bfloat16().float().detach().numpy()
        np.testing.assert_array_equal(b.detach().numpy(), ref, err_msg=n)
    x = it.tensor([[5, 6, 7, 8]])
    if version == 3:
        np.testing.assert_array_equal(model(x, x)[1].detach().numpy(), loaded(x, x)[1].detach().numpy())


def test_llmc_checkpoint_file_order(tmp_path):
    """The file holds llm.c's tensor order: wte, wpe, then each per-layer tensor stacked."""
    it.manual_seed(2)
    model = gpt2("tiny")
    model.save_llmc(tmp_path / "m.bin")
    data = np.fromfile(tmp_path / "m.bin", dtype="<f4", offset=1024)
    C, Vp, maxT = 64, 50304, 256
    wte = data[:Vp * C].reshape(Vp, C)
    np.testing.assert_array_equal(wte, model.transformer.wte.weight.detach().numpy())
    at = Vp * C + maxT * C
    ln1w = data[at:at + 2 * C].reshape(2, C)
    np.testing.assert_array_equal(ln1w[1], model.transformer.h[1].ln_1.weight.detach().numpy())
    at += 4 * C  # ln_1 weight and bias of both layers
    qkvw = data[at:at + 2 * 3 * C * C].reshape(2, 3 * C, C)
    np.testing.assert_array_equal(qkvw[0], model.transformer.h[0].attn.c_attn.weight.detach().numpy())
    np.testing.assert_array_equal(data[-C:], model.transformer.ln_f.bias.detach().numpy())


def test_broken_checkpoints(tmp_path):
    it.manual_seed(0)
    gpt2("tiny").save_llmc(tmp_path / "m.bin")
    good = (tmp_path / "m.bin").read_bytes()
    (tmp_path / "trunc.bin").write_bytes(good[:-100])
    with pytest.raises(DataFormatError, match="truncated"):
        GPT2.from_llmc(tmp_path / "trunc.bin")
    (tmp_path / "magic.bin").write_bytes(b"\x01\x02\x03\x04" + good[4:])
    with pytest.raises(DataFormatError, match="not an llm.c GPT-2 checkpoint"):
        GPT2.from_llmc(tmp_path / "magic.bin")
    header = np.frombuffer(good[:1024], dtype="<i4").copy()
    header[1] = 4
    (tmp_path / "ver.bin").write_bytes(header.tobytes() + good[1024:])
    with pytest.raises(DataFormatError, match="version 4 is not supported"):
        GPT2.from_llmc(tmp_path / "ver.bin")


LOG_LINE = re.compile(r"^step +(\d+)/(\d+) \| train loss (\d+\.\d{6}) \| lr \d\.\d\de[-+]\d\d \| "
                      r"\(\d+\.\d\d ms \| \d+ tok/s \| MFU \d+\.\d% \| peak used: +\d+ MB \| peak reserved: +\d+ MB \| "
                      r"DP=1, TP=1, SP=0, PP=1, CP=1\)$")


@pytest.mark.slow
def test_example_trains_and_logs(tmp_path):
    rng = np.random.default_rng(0)
    pattern = rng.integers(0, 300, 64)
    write_shard(tmp_path / "train.bin", np.tile(pattern, 40))
    write_shard(tmp_path / "val.bin", np.tile(pattern, 10))
    write_tokenizer(tmp_path / "tok.bin", [bytes([i % 256]) for i in range(50257)], 50256)
    args = ["--input_bin", str(tmp_path / "train.bin"),
           "--input_val_bin", str(tmp_path / "val.bin"), "--tokenizer_bin", str(tmp_path / "tok.bin"),
           "--model", "tiny", "--batch_size", "2", "--sequence_length", "32", "--total_batch_size", "128",
           "--num_iteration", "8", "--learning_rate", "3e-3", "--val_loss_every", "4",
           "--val_max_steps", "2", "--sample_every", "8", "--sample_length", "8", "--grad_clip", "1.0",
           "--warmup_iters", "2"]
    out = example(1, "gpt2", args)
    steps = [LOG_LINE.match(line) for line in out.splitlines() if line.startswith("step")]
    assert len(steps) == 8 and all(steps), out
    losses = [float(m.group(3)) for m in steps]
    assert losses[-1] < losses[0] - 1.0
    assert "x 2 accumulation steps" in out and "---- sample ----" in out
    assert out.count("val loss") == 3  # before training, after step 4, after step 8 (once)


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2])
def test_the_learning_rate_warms_up_then_decays_to_min_lr_and_resumes_on_it(tmp_path, ranks):
    """--lr_decay cosine --min_lr: each step's lr as llm.c's schedule gives it (warmup (k+1)/W,
    then min + (lr - min)(1 + cos(pi p))/2), the same on 1 and 2 ranks, and a run resumed halfway
    continues on the curve; --min_lr above --learning_rate is refused."""
    import math
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 300), 40))
    common = ["--input_bin", tmp_path / "t.bin", "--model", "tiny", "--batch_size", "1", "--sequence_length", "16",
              "--total_batch_size", "32", "--learning_rate", "1e-3", "--warmup_iters", "2", "--lr_decay", "cosine",
              "--min_lr", "1e-4"]
    lr_of = re.compile(r"^(?:\[0\] )?step\s+(\d+)/8 \| train loss \S+ \| lr (\S+)", re.M)
    out = example(ranks, "gpt2", [*common, "--num_iteration", "8", "--save", tmp_path / "ck", "--save_interval", "4"])
    got = {int(k): float(v) for k, v in lr_of.findall(out)}
    want = [1e-3 * (k + 1) / 2 if k < 2 else 1e-4 + 9e-4 * 0.5 * (1 + math.cos(math.pi * (k - 2) / 6))
            for k in range(8)]
    assert sorted(got) == list(range(1, 9)) and all(abs(got[k + 1] - w) <= 0.006 * w for k, w in enumerate(want)), got
    resumed = example(ranks, "gpt2", [*common, "--num_iteration", "8", "--load", tmp_path / "ck" / "step_000004"])
    assert {int(k): float(v) for k, v in lr_of.findall(resumed)} == {k: got[k] for k in range(5, 9)}, resumed
    refused = example(1, "gpt2", [*common, "--min_lr", "1e-2"], check=False)
    assert refused.returncode != 0 and "--min_lr 0.01 is above --learning_rate 0.001" in refused.stderr


@pytest.mark.slow
@pytest.mark.mpi
def test_eval_only_gives_the_validation_loss_a_run_ended_with(tmp_path):
    """--eval_only --load CHECKPOINT prints the validation loss the training run printed at its
    end, on 1 rank and on 2 (DP), trains nothing and writes nothing; without validation data it
    says what to give."""
    rng = np.random.default_rng(0)
    write_shard(tmp_path / "train.bin", np.tile(rng.integers(0, 50257, 300), 40))
    write_shard(tmp_path / "val.bin", np.tile(rng.integers(0, 50257, 300), 10))
    data = ["--input_bin", tmp_path / "train.bin", "--input_val_bin", tmp_path / "val.bin", "--model", "tiny",
            "--batch_size", "2", "--sequence_length", "32", "--val_max_steps", "3"]
    trained = example(1, "gpt2", [*data, "--num_iteration", "3", "--learning_rate", "3e-3", "--val_loss_every", "3",
                                  "--save", tmp_path / "ck"])
    last = re.findall(r"val loss (\S+)", trained)[-1]

    def evaluated(ranks, batch):
        out = example(ranks, "gpt2", [*data[:6], "--batch_size", batch, *data[8:], "--eval_only", "--load",
                                      tmp_path / "ck"])
        assert not re.search(r"^step +\d+/", out, re.M), out
        return re.findall(r"val loss (\S+)", out)
    assert evaluated(1, "2") == [last]
    # DP 2 x 2 sequences read the tokens one process reads 4 at a time
    (one,), (two,) = evaluated(1, "4"), evaluated(2, "2")
    assert abs(float(one) - float(two)) <= 2e-6, (one, two)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["latest", "step_000003"]
    refused = example(1, "gpt2", [*data[:2], *data[4:], "--eval_only"], check=False)
    assert refused.returncode != 0 and "--eval_only computes the validation loss: give --input_val_bin" in \
        refused.stderr, refused.stderr


@pytest.mark.slow
def test_example_rejects_bad_batch(tmp_path):
    write_shard(tmp_path / "t.bin", np.arange(1000))
    out = example(1, "gpt2", ["--input_bin", tmp_path / "t.bin", "--model", "tiny", "--batch_size", "2",
                              "--sequence_length", "16", "--total_batch_size", "50"], timeout=120, check=False)
    assert out.returncode != 0 and "not a multiple" in out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama3"])
def test_a_checkpoint_records_its_model_and_flags_so_load_alone_rebuilds_it(tmp_path, name):
    """meta.json records the model's class and configuration and the run's flags; `--load ckpt`
    with no --model rebuilds that model (here not the default preset) and evaluates it to the
    loss the run printed; a checkpoint of the other model's example is refused with a reason."""
    from infinitrain.checkpoint import read_meta
    rng = np.random.default_rng(0)
    write_shard(tmp_path / "train.bin", np.tile(rng.integers(0, 50257, 300), 40))
    write_shard(tmp_path / "val.bin", np.tile(rng.integers(0, 50257, 300), 10))
    data = ["--input_bin", tmp_path / "train.bin", "--input_val_bin", tmp_path / "val.bin", "--batch_size", "2",
            "--sequence_length", "32", "--val_max_steps", "2"]
    trained = example(1, name, [*data, "--model", "tiny", "--num_iteration", "2", "--val_loss_every", "2",
                                "--save", tmp_path / "ck"])
    extra = read_meta(tmp_path / "ck")["extra"]
    assert extra["model"]["class"] == ("GPT2" if name == "gpt2" else "LLaMA3") and extra["args"]["model"] == "tiny"
    assert extra["model"]["config"]["n_layer"] == 2 and extra["args"]["num_iteration"] == 2
    out = example(1, name, [*data, "--load", tmp_path / "ck", "--eval_only"])
    assert "as " + str(tmp_path / "ck") + " records it | 2 layers" in out, out
    assert re.findall(r"val loss (\S+)", out) == re.findall(r"val loss (\S+)", trained)[-1:], out
    other = "llama3" if name == "gpt2" else "gpt2"
    refused = example(1, other, [*data, "--load", tmp_path / "ck", "--eval_only"], check=False)
    assert refused.returncode != 0 and "use the example of that model" in refused.stderr, refused.stderr
