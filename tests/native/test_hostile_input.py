"""Bad input gets a clear error, never a crash, runaway memory or silent nonsense: the
examples' flags, checkpoint folders (every meta.json field mutated), llm.c headers that
describe huge models, unwritable --save locations and saves that fail half-way."""
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import infinitrain as it
from infinitrain import checkpoint
from infinitrain.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from infinitrain.data import write_shard
from infinitrain.io import DataFormatError
from infinitrain.models import GPT2, LLaMA3, gpt2
from infinitrain.optim import AdamW
from helpers import example, mpirun, run


# ---- the examples' flags ----------------------------------------------------------------------

BAD_FLAGS = [
    (["--total_batch_size", "-256"], "--total_batch_size: must be a positive integer"),
    (["--learning_rate", "nan"], "--learning_rate: must be a finite number"),
    (["--learning_rate", "inf"], "--learning_rate: must be a finite number"),
    (["--num_iteration", "0"], "--num_iteration: must be a positive integer"),
    (["--num_iteration", "-1"], "--num_iteration: must be a positive integer"),
    (["--weight_decay", "-5"], "--weight_decay: must be 0 or a positive number"),
    (["--grad_clip", "nan"], "--grad_clip: must be a finite number"),
    (["--val_loss_every", "-1"], "--val_loss_every: must be 0 or a positive integer"),
    (["--save_interval", "-1"], "--save_interval: must be 0 or a positive integer"),
    (["--batch_size", "0"], "--batch_size: must be a positive integer"),
    (["--sequence_length", "0"], "--sequence_length: must be a positive integer"),
    (["--max_checkpoint_keep", "-1"], "--max_checkpoint_keep: must be 0 or a positive integer"),
    (["--tensor_parallel", "0"], "--tensor_parallel: must be a positive integer"),
    (["--pipeline_timeout", "0"], "--pipeline_timeout: must be a positive number"),
    (["--batch_size", "four"], "--batch_size: 'four' is not an integer"),
]


@pytest.mark.parametrize("flags,message", BAD_FLAGS, ids=[" ".join(f) for f, _ in BAD_FLAGS])
def test_nonsense_flags_are_refused(flags, message, capsys):
    from infinitrain.examples.gpt2 import GPT2_PRESETS, __doc__ as doc
    from infinitrain.examples.lm_flags import parse_args
    with pytest.raises(SystemExit) as e:
        parse_args(flags, doc, GPT2_PRESETS, "gpt2")
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("flags,message", [(["--train_subset", "-10"], "--train_subset: must be 0 or"),
                                           (["--dropout", "1.5"], "--dropout: must be in [0, 1)"),
                                           (["--epochs", "0"], "--epochs: must be a positive integer")])
def test_nonsense_mnist_flags_are_refused(flags, message, capsys):
    from infinitrain.examples.mnist import parse_args
    with pytest.raises(SystemExit):
        parse_args(flags)
    assert message in capsys.readouterr().err


def _example(tmp_path, *flags, timeout=120):
    if not (tmp_path / "t.bin").exists():
        write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 200), 10))
    model = ["--model", "tiny"] if "--model" not in flags else []
    return example(1, "gpt2", ["--input_bin", tmp_path / "t.bin", *model, "--batch_size", "2",
                               "--sequence_length", "16", *flags], timeout=timeout, check=False)


@pytest.mark.slow
def test_an_unwritable_save_location_is_refused_before_training(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    out = _example(tmp_path, "--num_iteration", "3", "--save", str(tmp_path / "file" / "ck"))
    assert out.returncode != 0 and "cannot write checkpoints to" in out.stderr, out.stderr
    assert "train loss" not in out.stdout  # nothing trained


@pytest.mark.slow
@pytest.mark.parametrize("flags,message", [
    (["--profile", "{missing}/trace.json"], "--profile {missing}/trace.json: the folder"),
    (["--plot", "{missing}/loss.png"], "--plot {missing}/loss.png: the folder"),
    (["--precision_check", "level=1,output_path={file}/pc"], "--precision_check: cannot write to its output_path"),
    (["--lora_rank", "2", "--lora_save_path", "{file}/ad"], "--lora_save_path: cannot write"),
    (["--profile", "{folder}"], "--profile {folder} is a folder; give a file name"),
    (["--plot", "{folder}"], "--plot {folder} is a folder; give a file name"),
])
def test_unwritable_outputs_of_the_new_flags_are_refused_before_training(tmp_path, flags, message):
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "folder").mkdir()
    fill = lambda t: t.format(missing=tmp_path / "missing", file=tmp_path / "file", folder=tmp_path / "folder")  # noqa: E731
    out = _example(tmp_path, "--num_iteration", "2", *map(fill, flags))
    assert out.returncode != 0 and fill(message) in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert "train loss" not in out.stdout


def _bad_files(tmp_path) -> dict:
    """Files a flag may name that are not what it needs."""
    (tmp_path / "short.bin").write_bytes(b"garbage")
    (tmp_path / "folder").mkdir()
    fifo = tmp_path / "fifo.bin"
    os.mkfifo(fifo)
    return {"short": tmp_path / "short.bin", "folder": tmp_path / "folder", "fifo": fifo,
            "missing": tmp_path / "missing.bin"}


BAD_INPUTS = [("--input_bin", "short", "shorter than the 1024-byte llm.c header"),
              ("--input_bin", "folder", "is a directory, not a file"),
              ("--input_bin", "fifo", "is not a regular file (a FIFO"),
              ("--input_bin", "missing", "does not exist"),
              ("--input_val_bin", "short", "shorter than"),
              ("--tokenizer_bin", "short", "shorter than the llm.c header"),
              ("--tokenizer_bin", "folder", "is a directory"),
              ("--llmc_filepath", "missing", "checkpoint {path} does not exist"),
              ("--llmc_filepath", "short", "shorter than the llm.c header")]


@pytest.mark.slow
@pytest.mark.parametrize("flag,kind,message", BAD_INPUTS)
def test_a_bad_input_file_is_one_line_naming_the_flag(tmp_path, flag, kind, message):
    path = _bad_files(tmp_path)[kind]
    out = _example(tmp_path, "--num_iteration", "1", flag, str(path))
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{flag}: ") and message.format(path=path) in lines[0], out.stderr


@pytest.mark.slow
def test_a_bad_mnist_file_is_one_line_naming_the_flag(tmp_path):
    path = _bad_files(tmp_path)["folder"]
    out = example(1, "mnist", ["--data", path], timeout=120, check=False)
    assert out.returncode != 0 and out.stderr.strip() == f"--data: MNIST file {path} is a directory, not a file"


@pytest.mark.mpi
def test_a_bad_input_file_or_flag_is_reported_once_on_several_ranks(tmp_path):
    out = mpirun(2, ["-m", "infinitrain.examples.gpt2", "--model", "tiny", "--input_bin",
                     _bad_files(tmp_path)["short"]], check=False)
    assert out.returncode != 0 and (out.stdout + out.stderr).count("shorter than the 1024-byte") == 1, out.stderr
    assert "Traceback" not in out.stderr
    for flags, message in ((["--tensor_parallel", "3"], "cannot lay out the job"),  # before MPI, and after
                           (["--virtual_pipeline_parallel", "2"], "needs --pipeline_parallel 2 or more"),
                           (["--expert_parallel", "3"], "--expert_parallel 3 must divide data parallel 2"),
                           (["--expert_parallel", "2"], "but this model has no experts built over it")):
        write_shard(tmp_path / "t.bin", np.arange(2000) % 50257)
        out = mpirun(2, ["-m", "infinitrain.examples.gpt2", "--model", "tiny", "--input_bin", tmp_path / "t.bin",
                         *flags], check=False)
        assert out.returncode != 0 and (out.stdout + out.stderr).count(message) == 1, out.stderr


@pytest.mark.slow
def test_plot_without_matplotlib_is_refused_before_training_and_writes_exactly_its_path(tmp_path):
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 200), 10))
    flags = ["--input_bin", str(tmp_path / "t.bin"), "--model", "tiny", "--batch_size", "2",
             "--sequence_length", "16", "--num_iteration", "2", "--plot", str(tmp_path / "curves")]
    code = ("import sys; sys.modules['matplotlib'] = None  # as if it were not installed\n"
            "from infinitrain.examples.gpt2 import main; sys.exit(main(sys.argv[1:]))")
    out = mpirun(1, ["-c", code, *flags], timeout=120, check=False)
    assert out.returncode != 0 and "--plot: plotting needs matplotlib" in out.stderr, out.stderr
    assert "train loss" not in out.stdout
    pytest.importorskip("matplotlib")
    example(1, "gpt2", flags, timeout=120)
    assert (tmp_path / "curves").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (tmp_path / "curves.png").exists()


@pytest.mark.slow
@pytest.mark.parametrize("flags,message", [
    (["--virtual_pipeline_parallel", "2"], "--virtual_pipeline_parallel 2 splits each pipeline stage into chunks: "
                                           "it needs --pipeline_parallel 2 or more"),
    (["--sequence_length", "100000"], "--sequence_length 100000 exceeds the model's block size"),
    (["--device", "cpu:1"], "--device cpu:1: there is one CPU device"),
])
def test_flags_that_cannot_work_together_say_so_not_something_else(tmp_path, flags, message):
    out = _example(tmp_path, "--num_iteration", "1", *flags)
    assert out.returncode != 0 and out.stderr.strip() == out.stderr.strip().splitlines()[-1], out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr and "GB" not in out.stderr, out.stderr


@pytest.mark.slow
def test_zero_on_one_rank_trains_with_a_note(tmp_path):
    out = _example(tmp_path, "--num_iteration", "1", "--zero_stage", "2")
    assert out.returncode == 0 and "note: --zero_stage 2 has no effect with one data-parallel rank" in out.stdout


@pytest.mark.slow
def test_resuming_past_the_last_step_is_refused(tmp_path):
    assert _example(tmp_path, "--num_iteration", "2", "--save", str(tmp_path / "ck")).returncode == 0
    out = _example(tmp_path, "--num_iteration", "2", "--load", str(tmp_path / "ck"))
    assert out.returncode != 0 and "leaves nothing to train" in out.stderr, out.stderr


# ---- a save that fails half-way ---------------------------------------------------------------

def test_a_failed_save_leaves_nothing_behind(tmp_path, monkeypatch):
    model = gpt2("tiny")
    save_checkpoint(tmp_path, 1, model)

    def full_disk(save_file, arrays, path):
        Path(path).write_bytes(b"partial")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(checkpoint.writer, "_write_safetensors", full_disk)
    with pytest.raises(CheckpointError, match="No space left on device.*still names the previous"):
        save_checkpoint(tmp_path, 2, model)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000001"]
    assert (tmp_path / "latest").read_text().strip() == "step_000001"


def test_a_tied_embedding_is_stored_once(tmp_path):
    model = gpt2("tiny")
    path = save_checkpoint(tmp_path, 1, model)
    from safetensors.numpy import load_file
    stored = load_file(str(path / "model.safetensors"))
    assert "transformer.wte.weight" in stored and "lm_head.weight" not in stored
    again = gpt2("tiny", n_layer=2)
    load_checkpoint(path, again)
    assert again.lm_head.weight is again.transformer.wte.weight
    np.testing.assert_array_equal(again.lm_head.weight.detach().numpy(), model.lm_head.weight.detach().numpy())


# ---- meta.json, every field mutated -----------------------------------------------------------

VALUES = [None, 0, -1, 1e30, 10**30, "x", "", [], {}, [1, 2], {"a": 1}, True]


def _meta_mutations(meta):
    for key in list(meta):
        yield f"delete {key}", lambda m, k=key: m.pop(k)
        for v in VALUES:
            yield f"{key} = {v!r}", lambda m, k=key, v=v: m.__setitem__(k, v)
    yield "sha256 empty", lambda m: m.__setitem__("sha256", {})
    yield "sha256 outside", lambda m: m["sha256"].__setitem__("../../etc/passwd", "0" * 64)
    yield "sha256 absolute", lambda m: m["sha256"].__setitem__("/etc/passwd", "0" * 64)
    yield "step float", lambda m: m.__setitem__("step", 5.0)
    yield "rng negative", lambda m: m.__setitem__("rng", [1, -5])
    yield "dtype unknown", lambda m: m["dtypes"].__setitem__(next(iter(m["dtypes"])), "complex256")
    yield "optimizer groups", lambda m: m["optimizer"].__setitem__("param_groups", [{"lr": "x"}])
    yield "optimizer scalars", lambda m: m["optimizer"].__setitem__("scalars", {"transformer.wte.weight": 3})


def _stepped_checkpoint(tmp_path):
    it.manual_seed(0)
    model = gpt2("tiny")
    opt = AdamW(model.parameters())
    _, loss = model(it.tensor([[1, 2, 3]]), it.tensor([[2, 3, 4]]))
    loss.backward()
    opt.step()
    return model, opt, save_checkpoint(tmp_path / "ck", 1, model, opt)


def test_every_mutated_meta_json_is_a_checkpoint_error(tmp_path):
    model, opt, path = _stepped_checkpoint(tmp_path)
    original = json.loads((path / "meta.json").read_text())
    cases = list(_meta_mutations(json.loads(json.dumps(original))))
    assert len(cases) > 100
    for what, mutate in cases:
        meta = json.loads(json.dumps(original))
        mutate(meta)
        if meta == original:
            continue  # not a change (extra = {} when it was {})
        (path / "meta.json").write_text(json.dumps(meta))
        with pytest.raises(CheckpointError):
            load_checkpoint(path, model, opt)
        print("refused:", what)
    for text in ("", "[" * 100000, "{\"format\": 1", "\x00\xff", "[]"):
        (path / "meta.json").write_bytes(text.encode("latin-1"))
        with pytest.raises(CheckpointError, match="meta.json"):
            load_checkpoint(path, model, opt)


def _edit_meta(path, edit) -> None:
    """Changes meta.json and signs it again, as a tool that edits checkpoints would."""
    meta = json.loads((path / "meta.json").read_text())
    edit(meta)
    meta["meta_sha256"] = checkpoint._meta_digest(meta)
    (path / "meta.json").write_text(json.dumps(meta))


def test_optimizer_state_that_cannot_train_is_refused_at_load(tmp_path):
    """Signed but wrong: hyperparameters of the wrong type or range, a step that is a string,
    a moment missing: a CheckpointError at load, not a crash at the first step."""
    from safetensors.numpy import load_file, save_file
    name = "transformer.wte.weight"
    cases = [
        (lambda m: m["optimizer"]["param_groups"][0].__setitem__("betas", "x"), "betas must be two numbers"),
        (lambda m: m["optimizer"]["param_groups"][0].__setitem__("betas", [0.9, 1.5]), "betas must be two numbers"),
        (lambda m: m["optimizer"]["param_groups"][0].__setitem__("lr", "1e-3"), "must be finite numbers"),
        (lambda m: m["optimizer"]["param_groups"][0].__setitem__("eps", float("nan")), "must be finite numbers"),
        (lambda m: m["optimizer"]["scalars"][name].__setitem__("step", "1"), "step is str '1', not a count"),
        (lambda m: m["optimizer"]["scalars"][name].__setitem__("step", -3), "not a count >= 0"),
        (lambda m: m["optimizer"]["scalars"][name].__setitem__("lr_boost", 2), "has unknown entries lr_boost"),
    ]
    for edit, message in cases:
        model, opt, path = _stepped_checkpoint(tmp_path)
        _edit_meta(path, edit)
        with pytest.raises(CheckpointError, match=message):
            load_checkpoint(path, model, opt)
    model, opt, path = _stepped_checkpoint(tmp_path)  # a moment tensor missing from the file
    tensors = load_file(str(path / "optimizer.safetensors"))
    del tensors[f"{name}/exp_avg_sq"]
    save_file(tensors, str(path / "optimizer.safetensors"))
    _edit_meta(path, lambda m: m["sha256"].__setitem__("optimizer.safetensors",
                                                      checkpoint.sha256_file(path / "optimizer.safetensors")))
    with pytest.raises(CheckpointError, match="lacks exp_avg_sq"):
        load_checkpoint(path, model, opt)


def test_latest_cannot_point_outside_its_folder(tmp_path):
    model, opt, path = _stepped_checkpoint(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "meta.json").write_text("{}")
    for name in ("../elsewhere", "/etc", ".."):
        (tmp_path / "ck" / "latest").write_text(name + "\n")
        with pytest.raises(CheckpointError, match="not a checkpoint folder inside"):
            load_checkpoint(tmp_path / "ck", model, opt)


def test_ctrl_c_during_a_save_leaves_nothing_behind(tmp_path, monkeypatch):
    model, opt, _ = _stepped_checkpoint(tmp_path)

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(checkpoint.writer, "_write_safetensors", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path / "ck", 2, model, opt)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["latest", "step_000001"]


def _sigint_as_from_a_terminal() -> None:
    """preexec_fn of a child that the test sends SIGINT: its SIGINT at the default and unblocked,
    as a program started from a terminal has it, whatever the test runner's. A runner started in
    the background by a shell without job control (`pytest ... &` in a script) ignores SIGINT;
    the ignore survives exec, and a Python started ignoring SIGINT installs no KeyboardInterrupt
    handler: the child would train on through the test's Ctrl-C."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.slow
def test_ctrl_c_during_training_is_one_line_naming_the_last_checkpoint(tmp_path):
    import signal
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 200), 10))
    proc = run([sys.executable, "-m", "infinitrain.examples.gpt2", "--input_bin", tmp_path / "t.bin", "--model", "tiny",
                "--batch_size", "2", "--sequence_length", "16", "--num_iteration", "100000", "--save", tmp_path / "ck",
                "--save_interval", "2"], wait=False, preexec_fn=_sigint_as_from_a_terminal)
    try:
        for line in proc.stdout:
            if line.startswith("saved"):
                break
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:  # failed: not 100000 steps on a core for the rest of the run
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.strip().startswith("interrupted at step") and "the last complete checkpoint is" in err, err
    assert not list((tmp_path / "ck").glob(".*tmp*"))


@pytest.mark.slow
def test_the_ctrl_c_test_trains_with_sigint_at_its_default_even_under_a_runner_that_ignores_it():
    import signal
    probe = [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler"
             " and signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, []))"]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `pytest ... &` in a script starts it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        inherited = run(probe, check=True).stdout
        given = run(probe, check=True, preexec_fn=_sigint_as_from_a_terminal).stdout
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, previous)
    assert (inherited.strip(), given.strip()) == ("False", "True")


def test_a_ctrl_c_that_lands_in_a_finalizer_still_stops_training(capsys):
    """The SIGINT handler raises KeyboardInterrupt at the next Python line, which may be a
    __del__'s: Python prints that one and drops it. The training loop's guard keeps it."""
    from infinitrain.examples.lm_loop import CtrlCInFinalizers

    class Finalized:
        def __del__(self):
            raise KeyboardInterrupt  # where Ctrl-C's handler raised it

    before = sys.unraisablehook
    with CtrlCInFinalizers() as ctrl_c:
        ctrl_c.raise_if_caught()  # nothing yet
        Finalized()  # dropped at once
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.raise_if_caught()
    assert sys.unraisablehook is before and capsys.readouterr().err == ""


# ---- llm.c headers ----------------------------------------------------------------------------

def _header(magic, version, ints, floats=()):
    h = np.zeros(256, dtype="<i4")
    h[0], h[1] = magic, version
    h[2:2 + len(ints)] = ints
    for i, f in floats:
        h.view("<f4")[i] = f
    return h.tobytes()


@pytest.mark.parametrize("fields", [
    [1024, 50257, 10**6, 12, 768, 50304],    # a million layers
    [1024, 50257, 48, 32, 4096, 50304],      # 6 GB of weights
    [1024, 50257, -4, 12, 768, 50304],       # negative
    [0, 0, 0, 0, 0, 0],
], ids=["million-layers", "6GB", "negative", "zeros"])
def test_a_gpt2_header_cannot_eat_the_machine(tmp_path, fields):
    (tmp_path / "m.bin").write_bytes(_header(20240326, 3, fields))
    with pytest.raises(DataFormatError):
        GPT2.from_llmc(tmp_path / "m.bin")
    assert it.memory_stats()["allocated_bytes"] < 2**26  # nothing was built


@pytest.mark.parametrize("field,value", [(10, float("nan")), (10, -1e-5), (10, float("inf")),
                                         (11, float("inf")), (11, -10000.0), (16, float("inf"))],
                         ids=["norm_eps-nan", "norm_eps-negative", "norm_eps-inf", "rope_theta-inf",
                              "rope_theta-negative", "rope_scaling-inf"])
def test_a_llama_header_with_a_nonsense_float_is_refused(tmp_path, field, value):
    from infinitrain.models import LLaMA3Config
    cfg = LLaMA3Config(block_size=64, vocab_size=64, n_layer=1, n_head=2, n_kv_head=1, n_embd=16,
                       ffn_dim_multiplier=None, multiple_of=16, rope_theta=10000.0)
    LLaMA3(cfg, seed=0).save_llmc(tmp_path / "m.bin")
    raw = bytearray((tmp_path / "m.bin").read_bytes())
    raw[4 * field:4 * field + 4] = np.array([value], "<f4").tobytes()
    (tmp_path / "m.bin").write_bytes(bytes(raw))
    with pytest.raises(DataFormatError, match="must be a finite number > 0"):
        LLaMA3.from_llmc(tmp_path / "m.bin")


def test_nan_weights_in_a_loaded_file_are_named_in_a_warning(tmp_path):
    model = gpt2("tiny")
    model.save_llmc(tmp_path / "m.bin")
    raw = bytearray((tmp_path / "m.bin").read_bytes())
    raw[1024:1032] = np.array([np.nan, np.inf], "<f4").tobytes()  # the first tensor: wte
    (tmp_path / "m.bin").write_bytes(bytes(raw))
    with pytest.warns(RuntimeWarning, match="2 of its .* values are NaN or infinite"):
        GPT2.from_llmc(tmp_path / "m.bin")


def test_a_llama_header_with_a_huge_block_size_allocates_little(tmp_path):
    """block_size 2^26 in a file whose weights are tiny: the rotary tables are made for the
    positions in use, not for 2^26 of them."""
    from infinitrain.models import LLaMA3Config
    cfg = LLaMA3Config(block_size=2**26, vocab_size=64, n_layer=1, n_head=2, n_kv_head=1, n_embd=16,
                       ffn_dim_multiplier=None, multiple_of=16, rope_theta=10000.0)
    model = LLaMA3(cfg, seed=0)
    model.save_llmc(tmp_path / "m.bin")
    it.reset_peak_memory_stats()
    again = LLaMA3.from_llmc(tmp_path / "m.bin")
    assert it.memory_stats()["peak_allocated_bytes"] < 2**24
    x = it.tensor([[1, 2, 3, 4]])
    np.testing.assert_array_equal(again(x, x)[1].detach().numpy(), model(x, x)[1].detach().numpy())
    (tmp_path / "bad.bin").write_bytes(_header(20240803, 3, [64, 64, 1, 3, 2, 16], [(8, 0.0)]) + b"\0" * 4096)
    with pytest.raises(DataFormatError):
        LLaMA3.from_llmc(tmp_path / "bad.bin")


def test_a_corrupt_mnist_cache_says_what_to_do(tmp_path):
    from infinitrain.data.prepare import load_mnist
    (tmp_path / "mnist.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(DataFormatError, match="delete it and run `python -m infinitrain.data.prepare mnist`"):
        load_mnist(tmp_path / "mnist.npz")
    np.savez(tmp_path / "partial.npz", train_images=np.zeros((3, 28, 28), np.uint8))
    with pytest.raises(DataFormatError, match="the train split is missing or malformed"):
        load_mnist(tmp_path / "partial.npz")
    np.save(tmp_path / "pickled.npy", np.array([{"a": 1}], dtype=object))
    with pytest.raises(DataFormatError, match="not a readable MNIST cache"):
        load_mnist(tmp_path / "pickled.npy")


@pytest.mark.slow
def test_a_job_that_cannot_fit_in_memory_is_refused_before_it_starts(tmp_path):
    """GPT-2 XL with 64 x 1024-token sequences needs hundreds of GB: said and refused before
    anything is built (seconds, not the OOM killer)."""
    out = _example(tmp_path, "--model", "gpt2-xl", "--batch_size", "64", "--sequence_length", "1024",
                   timeout=60)
    assert out.returncode != 0 and "this job will not fit in memory" in out.stderr, out.stderr
    assert "GB per rank" in out.stderr and "--tensor_parallel" in out.stderr
    fits = _example(tmp_path, "--num_iteration", "1")
    assert fits.returncode == 0 and "memory: about" in fits.stdout, fits.stderr


def test_numpy_of_a_tensor_that_requires_grad_is_refused():
    """As PyTorch: a writable view would let writes bypass autograd; reading stays possible."""
    w = it.nn.Parameter(it.ones(3))
    with pytest.raises(RuntimeError, match=r"use tensor.detach\(\).numpy\(\)"):
        w.numpy()
    assert w.detach().numpy().tolist() == [1.0, 1.0, 1.0] and w.tolist() == [1.0, 1.0, 1.0]
    assert (w * 2).sum().item() == 6.0 and "Parameter containing" in repr(w)


def test_the_memory_estimate_counts_each_component_as_zero_shards_it():
    """memory_plan's components for GPT-2 124M at DP 4: ZeRO shards the AdamW state (stage 1),
    the gradients (2, with two buckets in flight; the tied embedding's gradient is not kept whole)
    and the parameters (3, with the embedding gathered); activations and the process stay."""
    from infinitrain.models import GPT2, GPT2_PRESETS
    from infinitrain.nn.parallel import Layout, ParallelPlan
    from infinitrain.nn.parallel.memory_plan import memory_plan
    parts = {}
    for stage in range(4):
        plan = ParallelPlan(Layout(4), zero_stage=stage, device="cpu")
        parts[stage] = memory_plan(plan, GPT2_PRESETS["gpt2"], GPT2, 2, 128, 1, "float32", 4)[3]
    P, emb = 124_475_904, 4 * 50304 * 768  # llm.c's count, the padded embedding's bytes
    assert abs(parts[0]["AdamW state"] - 8 * P) < 1e3 and abs(parts[1]["AdamW state"] - 2 * P) < 1e3
    assert parts[1]["gradients"] == parts[0]["gradients"] and "buckets in flight" not in parts[1]
    assert abs(parts[2]["gradients"] - P) < 1e3 and parts[2]["buckets in flight"] == 50 * 2**20
    assert abs(parts[3]["parameters"] - (P + emb)) < 1e3
    assert all(parts[s]["activations"] == parts[0]["activations"] for s in range(4))
    assert [sum(p.values()) for p in parts.values()] == sorted((sum(p.values()) for p in parts.values()), reverse=True)


def test_a_refused_job_is_told_the_zero_stage_or_the_offload_that_would_fit(monkeypatch):
    from types import SimpleNamespace
    from infinitrain.examples import lm_train
    from infinitrain.nn.parallel import Layout, ParallelPlan
    need = {0: 30, 1: 25, 2: 18, 3: 12}  # GB; 20 available; 19 with the moments on disk
    offloaded = {"nvme": 19, "nvme+param": 15}

    def estimate(plan, *model_and_batch):
        offload = "nvme+param" if plan.offload_param else plan.offload_optimizer
        if offload is not None:
            return offloaded[offload], 20, "plan", {"on disk": (8 if offload == "nvme" else 12) * 2**30}
        return need[plan.zero_stage], 20, "plan", {}
    monkeypatch.setattr(lm_train, "memory_plan", estimate)
    monkeypatch.setattr(lm_train, "_config_of", lambda args: (SimpleNamespace(block_size=64), None))
    args = SimpleNamespace(batch_size=1, sequence_length=8, dtype="float32")
    four, one = ParallelPlan(Layout(4), device="cpu"), ParallelPlan(Layout(1), device="cpu")
    with pytest.raises(SystemExit, match=r"Use --zero_stage 2 \(it would fit\), a smaller --model"):
        lm_train.check_memory(args, four, 1, 1, print)
    with pytest.raises(SystemExit, match=r"Use --offload_optimizer nvme --offload_path DIR \(it would fit, with "
                                         r"8.0 GB of AdamW state on that disk\), a smaller --model"):
        lm_train.check_memory(args, one, 1, 1, print)
    offloaded["nvme"] = 22  # the moments on disk are not enough; the parameters there too are
    with pytest.raises(SystemExit, match=r"Use --zero_stage 3 --offload_optimizer nvme --offload_param nvme "
                                         r"--offload_path DIR \(it would fit, with 12.0 GB of AdamW state and "
                                         r"parameters on that disk\), a smaller --model"):
        lm_train.check_memory(args, one, 1, 1, print)
    need[0] = 40
    monkeypatch.setattr(lm_train, "memory_plan", lambda *a, offload=None, **k: (40, 20, "plan", {}))
    with pytest.raises(SystemExit, match="Use a smaller --model"):
        lm_train.check_memory(args, one, 1, 1, print)


@pytest.mark.parametrize("value", ["nan", "-1", "inf"])
def test_a_collective_timeout_that_is_not_a_number_of_seconds_is_refused(value, capsys):
    """--collective_timeout nan or a negative value turned the watchdog off without a word (0 is
    the documented "off")."""
    from infinitrain.examples.lm_flags import parse_args
    from infinitrain.models import GPT2_PRESETS
    with pytest.raises(SystemExit):
        parse_args(["--collective_timeout", value], "", GPT2_PRESETS, "gpt2")
    assert "--collective_timeout" in capsys.readouterr().err


def test_convolution_pooling_and_batch_norm_sizes_that_overflow_are_refused_by_the_library():
    """N*C*H*W past 2^58 elements, negative and huge sizes: a status and a message naming the
    call, before any memory is touched (the buffers here hold 16 floats)."""
    from infinitrain._native import ffi, lib
    cpu, buf = ffi.new("it_device *", [lib.IT_CPU, 0])[0], ffi.new("float[16]")
    big = 2**20
    conv = dict(batch=big, in_channels=big, height=big, width=big, out_channels=1, kernel_h=1, kernel_w=1, stride_h=1,
                stride_w=1, pad_h=0, pad_w=0, dilation_h=1, dilation_w=1, groups=1)
    pool = dict(planes=big, height=big, width=big, kernel_h=2, kernel_w=2, stride_h=2, stride_w=2, pad_h=0, pad_w=0,
                dilation_h=1, dilation_w=1, ceil_mode=0)
    calls = {
        "it_conv2d_forward": lambda: lib.it_conv2d_forward(cpu, lib.IT_FLOAT32, buf, buf, buf, ffi.NULL,
                                                           ffi.new("it_conv2d_params *", conv)),
        "it_conv2d_backward": lambda: lib.it_conv2d_backward(cpu, lib.IT_FLOAT32, buf, buf, buf, buf, buf, buf,
                                                             ffi.new("it_conv2d_params *", dict(conv, batch=-1))),
        "it_max_pool2d_forward": lambda: lib.it_max_pool2d_forward(cpu, lib.IT_FLOAT32, buf, ffi.cast("int64_t *", buf),
                                                                   buf, ffi.new("it_pool2d_params *", pool)),
        "it_avg_pool2d_forward": lambda: lib.it_avg_pool2d_forward(
            cpu, lib.IT_FLOAT32, buf, buf, ffi.new("it_pool2d_params *", dict(pool, planes=1, kernel_h=2**62)), 1),
        "it_adaptive_avg_pool2d_forward": lambda: lib.it_adaptive_avg_pool2d_forward(cpu, lib.IT_FLOAT32, buf, buf,
                                                                                     big, big, big, 1, 1),
        "it_batchnorm_forward": lambda: lib.it_batchnorm_forward(cpu, lib.IT_FLOAT32, buf, buf, buf, buf, buf, buf,
                                                                 buf, buf, big, big, big, 1, 0.1, 1e-5),
    }
    for name, call in calls.items():
        assert call() == lib.IT_ERR_INVALID_ARGUMENT, name
        assert ffi.string(lib.it_last_error()).decode().startswith(name)


@pytest.mark.parametrize("module,flag,value", [
    ("transformer", "--grad_clip", "nan"), ("transformer", "--grad_clip", "-1"),
    ("transformer", "--weight_decay", "-0.1"), ("transformer", "--weight_decay", "inf"),
    ("transformer", "--adam_eps", "0"), ("transformer", "--adam_eps", "nan"),
    ("demo", "--steps", "-1"), ("demo", "--learning_rate", "nan"), ("demo", "--batch_size", "0"),
])
def test_meaningless_numbers_on_the_command_line_are_refused(module, flag, value, capsys):
    """Flags parsed as bare float/int took NaN, infinities and negative values without a word."""
    import importlib
    example = importlib.import_module(f"infinitrain.examples.{module}")
    with pytest.raises(SystemExit):
        (example.parse_args if hasattr(example, "parse_args") else example.main)([flag, value])
    assert flag in capsys.readouterr().err


def test_flags_that_do_nothing_in_this_run_are_named():
    """Flags typed on the command line that the run ignores (a checkpoint interval without
    --save, LoRA settings without LoRA, pipeline settings without a pipeline, ...) passed without
    a word."""
    from infinitrain.examples.lm_flags import parse_args
    from infinitrain.examples.lm_train import idle_flags
    from infinitrain.models import GPT2_PRESETS
    from infinitrain.nn.parallel import Layout, ParallelPlan
    argv = ["--save_interval", "5", "--lora_alpha", "8", "--pipeline_schedule", "gpipe", "--min_lr", "1e-5",
            "--cp_comm", "all_gather", "--collective_timeout", "60", "--tensor_parallel", "1", "--sequence_parallel"]
    args = parse_args(argv, "", GPT2_PRESETS, "gpt2")
    named = dict(idle_flags(args, ParallelPlan(Layout(1)), 1))
    assert set(named) == {"save_interval", "lora_alpha", "pipeline_schedule", "min_lr", "cp_comm",
                          "collective_timeout", "sequence_parallel"}, named
    assert named["min_lr"].startswith("with --lr_decay constant")
    used = parse_args(["--save", "ck", "--save_interval", "5", "--lr_decay", "cosine", "--min_lr", "1e-5"], "",
                      GPT2_PRESETS, "gpt2")
    assert idle_flags(used, ParallelPlan(Layout(1)), 1) == []


def test_max_position_embeddings_lifts_a_rope_presets_block_size_and_nothing_else(capsys):
    """LLaMA-3's rotary positions have no table, so its example takes longer sequences than a
    preset's block size when asked; GPT-2's learned table does not, and a checkpoint keeps its own."""
    from infinitrain.examples.lm_flags import parse_args
    from infinitrain.models import GPT2_PRESETS, LLAMA3_PRESETS
    args = parse_args(["--model", "small", "--max_position_embeddings", "8192"], "", LLAMA3_PRESETS, "small",
                      moe=True, rope=True)
    assert args.presets["small"].block_size == 8192 and LLAMA3_PRESETS["small"].block_size == 1024
    with pytest.raises(SystemExit):
        parse_args(["--max_position_embeddings", "8192", "--llmc_filepath", "x.bin"], "", LLAMA3_PRESETS, "small",
                   moe=True, rope=True)
    assert "a checkpoint's model keeps its own block size" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--max_position_embeddings", "8192"], "", GPT2_PRESETS, "gpt2")
    assert "unrecognized arguments: --max_position_embeddings" in capsys.readouterr().err
