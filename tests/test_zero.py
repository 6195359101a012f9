"""ZeRO stages 1 and 2 against one process: tiny GPT-2 and LLaMA-3 trained under DP 2, 4 and 8
with optimizer state (and, stage 2, gradients) sharded, gradient accumulation and clipping on:
the per-step losses and gradient norms equal the one-process run (fp32 within 1e-5, bf16 within
1e-2); and on DP 4 the per-rank peak tensor memory falls from DDP to stage 1 to stage 2."""
import re

import pytest

from test_tensor_parallel import assert_same, losses, run

COMMON = ["--batch", "8", "--steps", "6", "--clip", "0.5"]
_reference = {}


def one_process(model, dtype):
    if (model, dtype) not in _reference:
        _reference[(model, dtype)] = losses(run(1, ["--model", model, "--dtype", dtype, "--lr", "3e-3", *COMMON]))
    return _reference[(model, dtype)]


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("model,n,micro", [("gpt2", 2, 2), ("gpt2", 4, 2), ("gpt2", 8, 1), ("llama3", 4, 2)])
def test_zero_fp32_matches_one_process(model, n, micro, stage):
    got = losses(run(n, ["--model", model, "--lr", "3e-3", *COMMON, "--zero", str(stage), "--micro", str(micro)]))
    assert_same(got, one_process(model, "float32"), "float32", f"{model} ZeRO-{stage} DP {n} M {micro}")


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_zero_with_tensor_and_sequence_parallelism_matches_one_process(model, stage):
    """DP 2 x TP 2 + SP: ZeRO shards each TP rank's slices over DP; SP gradients are summed
    over TP before they are sharded; the norm counts TP shards over TP and replicas once."""
    got = losses(run(4, ["--model", model, "--lr", "3e-3", *COMMON, "--zero", str(stage), "--micro", "2",
                         "--tp", "2", "--sp"]))
    assert_same(got, one_process(model, "float32"), "float32", f"{model} ZeRO-{stage} DP 2 x TP 2 + SP")


@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_zero1_in_a_3d_layout_matches_one_process(model):
    """DP 2 x TP 2 x PP 2 with ZeRO-1 (the pipeline's tied-embedding sum acts on the flat
    gradients before they are sharded; the norm sums over stages and leaves the copy out)."""
    flags = ["--layers", "4", "--tp", "2", "--pp", "2", "--zero", "1", "--micro", "2"]
    ref = losses(run(1, ["--model", model, "--lr", "3e-3", *COMMON, "--layers", "4"]))
    got = losses(run(8, ["--model", model, "--lr", "3e-3", *COMMON, *flags]))
    assert_same(got, ref, "float32", f"{model} ZeRO-1 DP2 x TP2 x PP2")


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_bf16_matches_one_process(stage):
    got = losses(run(4, ["--model", "llama3", "--dtype", "bfloat16", "--lr", "3e-3", *COMMON,
                         "--zero", str(stage), "--micro", "2"]))
    assert_same(got, one_process("llama3", "bfloat16"), "bfloat16", f"llama3 bf16 ZeRO-{stage} DP 4")


def test_peak_memory_falls_with_the_stage():
    """A model whose parameters outweigh its activations (vocabulary 512, 4 layers of 128):
    DDP holds ~16P bytes of weights, gradients and AdamW state per rank, stage 1 ~10P, stage 2
    ~7P (plus activations and the bucket in flight)."""
    peaks = {}
    for stage in (0, 1, 2):
        out = run(4, ["--vocab", "512", "--embd", "128", "--layers", "4", "--batch", "8", "--steps", "3",
                      "--micro", "2", "--zero", str(stage)])
        P = int(re.search(r"^parameters (\d+)$", out, re.M).group(1))
        peaks[stage] = int(re.search(r"^peak_bytes (\d+)$", out, re.M).group(1))
    print({s: f"{v / 2**20:.2f} MB = {v / P:.1f} P" for s, v in peaks.items()})
    assert peaks[2] < peaks[1] < peaks[0], peaks
    assert peaks[1] < 0.75 * peaks[0] and peaks[2] < 0.85 * peaks[1], peaks


def test_zero_stage_flag_of_the_example_matches_one_process(tmp_path):
    """`mpiexec -n 4 python -m infinitrain.examples.gpt2 --zero_stage 2` with warmup (the
    schedule reaches the sharded optimizer), accumulation and clipping: one process's losses."""
    import subprocess
    import sys

    import numpy as np
    from infinitrain.data import write_shard
    from test_distributed import ENV, _losses, mpirun
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 300), 40))
    args = ["-m", "infinitrain.examples.gpt2", "--input_bin", str(tmp_path / "t.bin"), "--model", "tiny",
            "--batch_size", "2", "--sequence_length", "32", "--num_iteration", "5", "--learning_rate", "3e-3",
            "--warmup_iters", "3", "--grad_clip", "0.5", "--total_batch_size", "256"]
    one = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=ENV)
    assert one.returncode == 0, one.stderr
    for stage in ("1", "2"):
        got = mpirun(4, args + ["--zero_stage", stage, "--save", str(tmp_path / f"ck{stage}"), "--save_interval", "2"])
        np.testing.assert_allclose(_losses(got), _losses(one.stdout), rtol=1e-5, atol=0, err_msg=f"stage {stage}")
    # the stage-2 checkpoint of step 2 resumes on DP 2 at stage 1
    resumed = mpirun(2, args + ["--zero_stage", "1", "--load", str(tmp_path / "ck2" / "step_000002")])
    np.testing.assert_allclose(_losses(resumed), _losses(one.stdout)[2:], rtol=1e-5, atol=0)


def test_a_zero2_checkpoint_resumes_under_another_dp_size(tmp_path):
    """Saved by ZeRO-2 on DP 4 at step 3 (the optimizer state gathered into one process's form),
    resumed by ZeRO-2 on DP 2, ZeRO-1 on DP 8 and one process: the uninterrupted losses."""
    common = ["--batch", "8", "--micro", "1", "--clip", "0.5", "--lr", "3e-3"]
    whole = losses(run(1, common + ["--steps", "6"]))[0][::2]
    run(4, common + ["--zero", "2", "--steps", "3", "--save", str(tmp_path / "ck")])
    resume = common + ["--steps", "6", "--first", "4", "--load", str(tmp_path / "ck")]
    import numpy as np
    for n, flags in ((2, ["--zero", "2"]), (8, ["--zero", "1"]), (1, []), (4, ["--zero", "2", "--tp", "2"])):
        got = losses(run(n, resume + flags))[0][::2]
        np.testing.assert_allclose(got, whole[3:], rtol=1e-5, atol=0, err_msg=f"{n} ranks {flags}")
