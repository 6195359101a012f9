"""Offloaded optimizer state on several ranks: under DP 2 with ZeRO 0, 1, 2 and 3, GPT-2 and
LLaMA-3 trained with each rank's (shard of the) AdamW state on disk give the same bits as the
same run without offload (every step's loss and gradient norm, every parameter, the sample);
a checkpoint of an offloaded run resumes without offload and the other way round, bit for bit;
ZeRO-3's parameter pieces offloaded too (offload_param) give the same bits and resume both ways;
the example's flags refuse what cannot work before anything is built."""
import re

import pytest

from helpers import example, parallel_train_runs

COMMON = ["--batch", "8", "--steps", "4", "--micro", "2", "--clip", "0.5", "--lr", "3e-3"]


def _result(stdout: str) -> list:
    """Everything rank 0 prints that the training decides: the loss and norm lines, the digest of
    every parameter, the sampled tokens."""
    return re.findall(r"^(?:\[[^\]]*\] ?)?((?:loss|digest|sample) .*)$", stdout, re.M)


@pytest.mark.mpi
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_offloaded_state_gives_the_same_bits_at_every_zero_stage(tmp_path, model, stage):
    flags = ["--model", model, *COMMON, "--zero", str(stage)]
    plain, offloaded = map(_result, parallel_train_runs(2, [flags, flags + ["--offload", "nvme", "--offload_path",
                                                                             str(tmp_path)]]))
    assert len(plain) == 6 and offloaded == plain
    assert list(tmp_path.iterdir()) == []  # the scratch files went with the processes


@pytest.mark.mpi
@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_checkpoints_resume_across_offload_both_ways(tmp_path, model):
    common = ["--model", model, *COMMON[:-4], "--clip", "0.5", "--lr", "3e-3", "--micro", "2"]
    offload = ["--offload", "nvme", "--offload_path", str(tmp_path)]
    runs = [common + ["--zero", "2", "--steps", "6"]]  # all in one job, one run after another
    for first, second in ((offload, []), ([], offload)):
        ck = tmp_path.parent / f"ck-{model}-{bool(first)}"
        runs += [common + ["--zero", "2", "--steps", "3", "--save", str(ck)] + first,
                 common + ["--zero", "2", "--steps", "6", "--first", "4", "--load", str(ck)] + second]
    whole, _, resumed_plain, _, resumed_offloaded = map(_result, parallel_train_runs(2, runs))
    assert resumed_plain[:3] == whole[3:6] and resumed_offloaded[:3] == whole[3:6]


@pytest.mark.mpi
@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_offloaded_parameters_give_the_same_bits_and_resume_both_ways(tmp_path, model):
    """ZeRO-3 with offload_param nvme (each rank's parameter pieces on disk with the state): the
    bits of ZeRO-3 without offload; a checkpoint resumes across it both ways."""
    common = ["--model", model, *COMMON[:-4], "--clip", "0.5", "--lr", "3e-3", "--micro", "2", "--zero", "3"]
    offload = ["--offload", "nvme", "--offload_path", str(tmp_path), "--offload_param", "nvme",
               "--offload_buffer_mb", "0.5"]  # many blocks: parameters and units cut across them
    runs = [common + ["--steps", "6"], common + ["--steps", "6"] + offload]  # all in one job, one after another
    for first, second in ((offload, []), ([], offload)):
        ck = tmp_path.parent / f"ck-param-{model}-{bool(first)}"
        runs += [common + ["--steps", "3", "--save", str(ck)] + first,
                 common + ["--steps", "6", "--first", "4", "--load", str(ck)] + second]
    whole, offloaded, _, resumed_plain, _, resumed_offloaded = map(_result, parallel_train_runs(2, runs))
    assert offloaded == whole
    assert resumed_plain[:3] == whole[3:6] and resumed_offloaded[:3] == whole[3:6]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("flags,message", [
    (["--offload_optimizer", "cpu"], "--offload_optimizer cpu moves the AdamW state off the GPU; with --device cpu"),
    (["--offload_optimizer", "nvme"], "--offload_optimizer nvme needs --offload_path DIR"),
    (["--offload_optimizer", "nvme", "--offload_path", "/nonexistent/dir"], "--offload_path /nonexistent/dir: no such"),
    (["--offload_path", "/tmp"], "--offload_path is for --offload_optimizer nvme"),
    (["--offload_param", "nvme"],
     "--offload_param nvme offloads ZeRO-3's pieces of the parameters: add --zero_stage 3"),
    (["--zero_stage", "3", "--offload_param", "nvme"], "keeps the parameters with the AdamW state, which the step "
                                                       "updates together: add --offload_optimizer nvme"),
])
def test_offload_flags_that_cannot_work_are_refused_before_anything_is_built(flags, message):
    out = example(1, "gpt2", ["--model", "tiny", "--num_iteration", "1", *flags], timeout=120, check=False)
    assert out.returncode != 0 and message in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert "memory:" not in out.stdout


@pytest.mark.mpi
def test_the_example_trains_with_offload_as_without(tmp_path):
    """`mpirun -np 2 python -m infinitrain.examples.gpt2 --zero_stage 1 --offload_optimizer nvme`:
    the same losses as without, the offload said at start-up, the disk figure in the estimate."""
    args = ["--model", "tiny", "--num_iteration", "3", "--batch_size", "2", "--sequence_length", "32",
            "--zero_stage", "1", "--learning_rate", "1e-3"]
    plain = example(2, "gpt2", args)
    offloaded = example(2, "gpt2", args + ["--offload_optimizer", "nvme", "--offload_path", str(tmp_path)])
    losses = [re.findall(r"train loss (\S+)", out) for out in (plain, offloaded)]
    assert len(losses[0]) == 3 and losses[0] == losses[1]
    assert "offload: OffloadOptimizer(AdamW" in offloaded and "direct I/O" in offloaded
    assert re.search(r"GB of AdamW moments on disk", offloaded)


@pytest.mark.slow
def test_one_process_trains_with_its_parameters_on_disk_as_without(tmp_path):
    """`python -m infinitrain.examples.gpt2 --zero_stage 3 --offload_optimizer nvme --offload_param
    nvme` on one process (ZeRO-Infinity's single-device case): the losses of the plain run, the
    parameters said to be on disk."""
    args = ["--model", "tiny", "--num_iteration", "3", "--batch_size", "2", "--sequence_length", "32",
            "--learning_rate", "1e-3"]
    plain = example(1, "gpt2", args)
    offloaded = example(1, "gpt2", args + ["--zero_stage", "3", "--offload_optimizer", "nvme", "--offload_param",
                                           "nvme", "--offload_path", str(tmp_path)])
    losses = [re.findall(r"train loss (\S+)", out) for out in (plain, offloaded)]
    assert len(losses[0]) == 3 and losses[0] == losses[1]
    assert "exp_avg/exp_avg_sq/parameters in a scratch file" in offloaded
    assert re.search(r"GB of AdamW moments and parameters on disk", offloaded) and "has no effect" not in offloaded
