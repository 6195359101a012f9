"""Checkpoints: save/load round trips, integrity and version checks, a killed save, exact
resume of the training example, and safetensors export."""
import json
import re
import signal

import numpy as np
import pytest

import infinitrain as it
from infinitrain.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from infinitrain.data import write_shard
from infinitrain.models import GPT2, LLaMA3, gpt2, llama3
from infinitrain.plot import parse_log
from helpers import example, mpirun


def _trained(steps=3):
    it.manual_seed(0)
    model = gpt2("tiny")
    opt = it.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    x = it.tensor(np.arange(32).reshape(2, 16) % 50)
    for _ in range(steps):
        _, loss = model(x, x, return_logits=False)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt, x


def test_round_trip_restores_model_optimizer_and_rng(tmp_path):
    model, opt, x = _trained()
    it.manual_seed(123)
    it.randn(5)
    path = save_checkpoint(tmp_path, 3, model, opt, extra={"note": "hi"})
    assert path.name == "step_000003" and (tmp_path / "latest").read_text().strip() == "step_000003"
    expected_rng = it.default_generator.get_state()
    after = it.randn(4).numpy()

    it.manual_seed(999)
    model2 = gpt2("tiny")
    opt2 = it.optim.AdamW(model2.parameters(), lr=1e-3, betas=(0.9, 0.95))
    meta = load_checkpoint(tmp_path, model2, opt2)
    assert meta["step"] == 3 and meta["extra"] == {"note": "hi"}
    assert it.default_generator.get_state() == expected_rng
    np.testing.assert_array_equal(it.randn(4).numpy(), after)
    for (n, a), (_, b) in zip(model.named_parameters(), model2.named_parameters()):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy(), err_msg=n)
    for m, o in ((model, opt), (model2, opt2)):  # one more step: identical
        _, loss = m(x, x, return_logits=False)
        o.zero_grad()
        loss.backward()
        o.step()
    for (n, a), (_, b) in zip(model.named_parameters(), model2.named_parameters()):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy(), err_msg=n)


def test_damaged_foreign_and_mismatched_checkpoints(tmp_path):
    model, opt, _ = _trained(1)
    path = save_checkpoint(tmp_path / "a", 1, model, opt)
    blob = bytearray((path / "model.safetensors").read_bytes())
    blob[-5] ^= 0xFF
    (path / "model.safetensors").write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="damaged"):
        load_checkpoint(path, model, opt)
    path = save_checkpoint(tmp_path / "b", 1, model, opt)
    meta = json.loads((path / "meta.json").read_text())
    meta["version"] = 99
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="version 99"):
        load_checkpoint(path, model)
    path = save_checkpoint(tmp_path / "c", 1, model, opt)
    other = gpt2("tiny", n_layer=3)
    with pytest.raises(CheckpointError, match="missing keys: transformer.h.2"):
        load_checkpoint(path, other)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "nothing", model)


@pytest.mark.slow
def test_killed_save_leaves_previous_checkpoint(tmp_path):
    """A save killed while writing (here: SIGKILL from inside it) keeps `latest` valid."""
    model, opt, _ = _trained(1)
    save_checkpoint(tmp_path, 1, model, opt)
    script = f"""
import os, signal, numpy as np
import infinitrain as it
from infinitrain.models import gpt2
from infinitrain import checkpoint
from infinitrain.checkpoint import writer
model = gpt2("tiny")
real = writer.sha256_file
def die(path):
    os.kill(os.getpid(), signal.SIGKILL)  # killed half-way through writing step 2
writer.sha256_file = die  # where the save looks it up
checkpoint.save_checkpoint({str(tmp_path)!r}, 2, model)
"""
    out = mpirun(1, ["-c", script], timeout=120, check=False)
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    assert (tmp_path / "latest").read_text().strip() == "step_000001"
    fresh = gpt2("tiny")
    meta = load_checkpoint(tmp_path, fresh, it.optim.AdamW(fresh.parameters()))
    assert meta["step"] == 1


def test_keep_limits_checkpoints(tmp_path):
    model, opt, _ = _trained(1)
    for s in range(1, 5):
        save_checkpoint(tmp_path, s, model, opt, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["step_000003", "step_000004"]


@pytest.mark.slow
def test_resume_prints_the_uninterrupted_losses(tmp_path):
    pattern = np.random.default_rng(0).integers(0, 300, 64)
    write_shard(tmp_path / "train.bin", np.tile(pattern, 60))
    base = ["--input_bin", tmp_path / "train.bin", "--model", "tiny", "--batch_size", "2", "--sequence_length", "32",
            "--num_iteration", "10", "--learning_rate", "3e-3", "--warmup_iters", "3"]

    def losses(out):
        return dict(parse_log(out)["train"])  # {step: loss} (the package's own log parser)
    full = losses(example(1, "gpt2", base))
    first = example(1, "gpt2", base[:-6] + ["--num_iteration", "5", "--learning_rate", "3e-3", "--warmup_iters", "3",
                                            "--save", tmp_path / "ck"])
    assert losses(first) == {k: v for k, v in full.items() if k <= 5}
    resumed = example(1, "gpt2", base + ["--load", tmp_path / "ck"])
    assert "resumed from" in resumed
    assert losses(resumed) == {k: v for k, v in full.items() if k > 5}


@pytest.mark.parametrize("factory,cls", [(lambda: gpt2("tiny"), GPT2), (lambda: llama3("tiny"), LLaMA3)])
def test_save_pretrained_safetensors(tmp_path, factory, cls):
    it.manual_seed(4)
    model = factory()
    model.save_pretrained(tmp_path)  # transformers' layout (tests/models/test_hf.py loads it there)
    again = cls.from_pretrained(tmp_path)
    x = it.tensor([[3, 1, 4, 1, 5]])
    np.testing.assert_allclose(model(x, x)[1].detach().numpy(), again(x, x)[1].detach().numpy(), rtol=1e-6)
    # the package's earlier format (its own names and config keys) still loads
    from dataclasses import asdict
    from safetensors.numpy import save_file
    old = tmp_path / "old"
    old.mkdir()
    save_file({k: np.ascontiguousarray(v.detach().numpy()) for k, v in model.state_dict().items()},
              str(old / "model.safetensors"))
    (old / "config.json").write_text(json.dumps({"model_type": cls.__name__, **asdict(model.config)}))
    np.testing.assert_array_equal(model(x, x)[1].detach().numpy(), cls.from_pretrained(old)(x, x)[1].detach().numpy())


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_written_files_follow_the_umask(tmp_path, umask):
    """Checkpoints, transformers exports and LoRA adapters are readable as the umask says (a
    team's shared storage), not owner-only as safetensors alone writes them."""
    import os
    from infinitrain.checkpoint import save_lora, save_pretrained
    from infinitrain.nn.lora import apply_lora
    model, opt, _ = _trained(steps=1)
    old = os.umask(umask)
    try:
        save_checkpoint(tmp_path / "ck", 1, model, opt)
        save_pretrained(model, tmp_path / "hf")
        apply_lora(model, 2, 4, ["c_attn"])
        save_lora(model, tmp_path / "lora")
    finally:
        os.umask(old)
    modes = {p.relative_to(tmp_path).as_posix(): p.stat().st_mode & 0o777 for p in tmp_path.rglob("*") if p.is_file()}
    assert len(modes) >= 7 and set(modes.values()) == {0o666 & ~umask}, modes


def test_rotation_keeps_the_newest_steps_as_recorded_not_as_named(tmp_path):
    """--max_checkpoint_keep ordered by name deleted step_1000000 (it sorts before step_999999);
    by the step each records it deletes the oldest, and never what was just written or `latest`."""
    model, opt, _ = _trained(steps=1)
    for step in (999_999, 1_000_000, 1_000_001):
        save_checkpoint(tmp_path / "ck", step, model, opt, keep=2)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["latest", "step_1000000", "step_1000001"]
    assert (tmp_path / "ck" / "latest").read_text().strip() == "step_1000001"
    # a higher-numbered folder left by another run does not take the new checkpoint's place
    save_checkpoint(tmp_path / "mixed", 10, model, opt)
    save_checkpoint(tmp_path / "mixed", 2, model, opt, keep=1)
    latest = (tmp_path / "mixed" / "latest").read_text().strip()
    assert latest == "step_000002" and (tmp_path / "mixed" / latest / "meta.json").is_file()


@pytest.mark.slow
def test_a_save_folder_of_another_run_is_refused_and_a_finished_run_is_not_rewritten(tmp_path):
    """A fresh run saving into a folder that holds another run's later checkpoints is refused
    (their rotation and `latest` would mix); --resume auto onto fewer iterations than the
    checkpoint trains nothing and writes no older checkpoint (it wrote step_000001 and moved
    `latest` back)."""
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 300), 40))
    args = ["--input_bin", tmp_path / "t.bin", "--model", "tiny", "--batch_size", "2", "--sequence_length", "16",
            "--save", tmp_path / "ck"]
    example(1, "gpt2", [*args, "--num_iteration", "2"])
    refused = example(1, "gpt2", [*args, "--num_iteration", "3"], check=False)
    assert refused.returncode != 0 and "holds checkpoints of another run (step_000002) at or past step 1" in \
        refused.stderr, refused.stderr
    out = example(1, "gpt2", [*args, "--num_iteration", "1", "--resume", "auto"])
    assert "is at step 2: training was complete" in out, out
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["latest", "step_000002"]
    assert (tmp_path / "ck" / "latest").read_text().strip() == "step_000002"
    example(1, "gpt2", [*args, "--num_iteration", "3", "--resume", "auto"])  # continuing it is fine
    assert (tmp_path / "ck" / "latest").read_text().strip() == "step_000003"


@pytest.mark.slow
def test_a_restarted_job_resumes_its_own_checkpoints_even_when_started_from_load_or_without_latest(tmp_path):
    """--resume auto (what a restart runs) prefers --save's own newest checkpoint to --load (a
    fine-tune started from A and restarted continues its run, not A again), and finds it by the
    steps recorded when a kill came between the rename and `latest`."""
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 300), 40))
    args = ["--input_bin", tmp_path / "t.bin", "--model", "tiny", "--batch_size", "2", "--sequence_length", "16"]
    example(1, "gpt2", [*args, "--num_iteration", "2", "--save", tmp_path / "a"])
    tuned = [*args, "--load", tmp_path / "a", "--save", tmp_path / "b", "--save_interval", "1"]
    example(1, "gpt2", [*tuned, "--num_iteration", "3"])
    out = example(1, "gpt2", [*tuned, "--num_iteration", "4", "--resume", "auto"])
    assert "resuming from them, not --load" in out and re.findall(r"step +(\d+)/4", out) == ["4"], out
    (tmp_path / "b" / "latest").unlink()  # as if killed after step_000004's rename, before `latest`
    out = example(1, "gpt2", [*tuned, "--num_iteration", "5", "--resume", "auto"])
    assert re.findall(r"step +(\d+)/5", out) == ["5"], out
