"""examples/c_host/train_gpt2.c: GPT-2 trained by a C program on the ABI alone gives the Python
example's losses, and bad input gets a message and a non-zero exit, never a crash."""
import re
import shutil

import numpy as np
import pytest

from helpers import ROOT, example, run, write_tokens

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The C host built as test_c_host_builds_and_runs builds main.c, a tiny llm.c checkpoint and
    a token shard."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    from infinitrain import config
    from infinitrain.models import gpt2
    d = tmp_path_factory.mktemp("c_host_train")
    exe = d / "train_gpt2"
    run([cc, "-O2", str(ROOT / "examples" / "c_host" / "train_gpt2.c"), *config.cflags().split(),
         *config.libs().split(), "-lm", "-o", exe], check=True)
    gpt2("tiny").save_llmc(d / "tiny.bin")
    write_tokens(d / "train.bin")
    return d, exe


def step_losses(stdout: str) -> list:
    return [float(x) for x in re.findall(r"train loss (\S+)", stdout)]


def test_c_host_losses_equal_the_python_examples(files):
    d, exe = files
    B, T, steps, lr, wd = 4, 32, 4, "1e-3", "0.1"  # weight decay on: the C host decays what Python decays
    out = run([exe, "-e", d / "tiny.bin", "-i", d / "train.bin", "-b", B, "-t", T, "-n", steps, "-l", lr,
               "-w", wd], timeout=120, check=True).stdout
    assert re.search(r"^step 0: train loss \S+ \(took \S+ ms\)$", out, re.M), out  # llm.c's line
    python = example(1, "gpt2", ["--llmc_filepath", d / "tiny.bin", "--input_bin", d / "train.bin",
                                 "--batch_size", B, "--sequence_length", T, "--num_iteration", steps,
                                 "--learning_rate", lr, "--weight_decay", wd], timeout=120)
    c_losses, py_losses = step_losses(out), step_losses(python)
    assert len(c_losses) == steps and len(py_losses) == steps, (out, python)
    np.testing.assert_allclose(c_losses, py_losses, rtol=1e-5)
    assert c_losses[-1] < c_losses[0]


def test_c_host_reads_bfloat16_checkpoints(files):
    """llm.c's version 5 checkpoint, widened to float32 by it_cast, trains as Python's load of it."""
    d, exe = files
    from infinitrain.models import GPT2
    GPT2.from_llmc(d / "tiny.bin").save_llmc(d / "tiny_bf16.bin", version=5)
    args = ["-e", d / "tiny_bf16.bin", "-i", d / "train.bin", "-b", 2, "-t", 16, "-n", 2]
    out = run([exe, *args], timeout=120, check=True).stdout
    python = example(1, "gpt2", ["--llmc_filepath", d / "tiny_bf16.bin", "--input_bin", d / "train.bin",
                                 "--batch_size", 2, "--sequence_length", 16, "--num_iteration", 2], timeout=120)
    np.testing.assert_allclose(step_losses(out), step_losses(python), rtol=1e-5)


@pytest.mark.parametrize("args, message", [
    (["-e", "missing.bin"], "cannot open checkpoint missing.bin: No such file"),
    (["-e", "train.bin"], "magic number 20240520 is not an llm.c GPT-2 checkpoint's"),
    (["-e", "truncated.bin"], "truncated"),
    (["-e", "huge.bin"], "parameters: not a checkpoint"),  # sizes that would overflow when multiplied
    (["-i", "tiny.bin"], "is not an llm.c token shard's"),
    (["-i", "missing.bin"], "cannot open token shard missing.bin"),
    (["-b", "64", "-t", "256"], "12000 tokens are fewer than one step needs (16385 = batch 64 x sequence 256 + 1)"),
    (["-t", "300"], "-t 300 is longer than the checkpoint's block size 256"),
    (["-b", "0"], "-b 0: expected a positive integer"),
    (["-l", "fast"], "-l fast: expected a finite number >= 0"),
    (["-q", "1"], "unknown flag -q"),
    (["-n"], "flag -n needs a value"),
    (["-d", "tpu"], "-d tpu: expected cpu or cuda"),
])
def test_c_host_bad_input(files, args, message):
    d, exe = files
    if not (d / "truncated.bin").exists():
        (d / "truncated.bin").write_bytes((d / "tiny.bin").read_bytes()[:-4])
        header = np.zeros(256, "<i4")
        header[:8] = (20240326, 3, 2**31 - 1, 2**31 - 1, 2**31 - 1, 1, 2**31 - 1, 2**31 - 1)
        (d / "huge.bin").write_bytes(header.tobytes())
    out = run([exe, "-e", "tiny.bin", "-i", "train.bin", "-n", "1", *args], timeout=60, cwd=d)
    assert out.returncode == 1, (out.stdout, out.stderr)  # not a signal: no crash
    assert message in out.stderr, out.stderr


def test_c_host_without_a_gpu_says_so(files):
    d, exe = files
    from infinitrain import cuda
    if cuda.is_available():
        pytest.skip("a GPU is here: -d cuda would train")
    out = run([exe, "-e", "tiny.bin", "-i", "train.bin", "-n", "1", "-d", "cuda"], timeout=60, cwd=d)
    assert out.returncode == 1 and "IT_ERR_NO_CUDA" in out.stderr, (out.stdout, out.stderr)
