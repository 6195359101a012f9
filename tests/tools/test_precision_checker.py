"""The precision checker: InfiniTrain's config string; statistics, md5 and .npy dumps of every
module's (level 1) or op's (level 2) outputs and gradients; the first NaN named where it
appears; and the compare mode naming the first tensor that differs from a baseline run, silent
when a DP or TP run equals the one-process run up to the round-off a reduction order explains."""
import hashlib
import re

import numpy as np
import pytest

import infinitrain as it
from infinitrain.models import GPT2Config
from infinitrain.models.gpt2 import GPT2
from infinitrain.precision_checker import PrecisionCheckConfig, PrecisionChecker
from helpers import example

CFG = GPT2Config(block_size=16, vocab_size=300, n_layer=2, n_head=2, n_embd=16)


def one_step(model, checker, step=1):
    x = it.from_numpy(np.random.default_rng(0).integers(0, 300, (2, 16)))
    checker.begin_step(step)
    _, loss = model(x, x, return_logits=False)
    loss.backward()
    checker.end_step()


def test_config_string_and_its_errors():
    c = PrecisionCheckConfig.parse("level=2,format=table,output_md5=true,path=/tmp/x,save_tensors=1,rtol=1e-3")
    assert (c.level, c.format, c.output_md5, c.output_path, c.save_tensors, c.rtol, c.atol) == \
        (2, "table", True, "/tmp/x", True, 1e-3, None)
    assert (PrecisionCheckConfig().rtol, PrecisionCheckConfig().atol) == (None, None)  # the round-off bound
    for bad, msg in [("rtol=-1", "not a valid float"), ("atol=nan", "not a valid float"),
                     ("level=3", "level must be"), ("format=csv", "format must be"), ("colour=red", "not key=value"),
                     ("output_md5=maybe", "not a valid"), ("level", "not key=value"),
                     ("baseline=/nonexistent", "not a folder")]:
        with pytest.raises(ValueError, match=msg):
            PrecisionCheckConfig.parse(bad)


def test_level1_statistics_md5_and_dumps(tmp_path):
    model = GPT2(CFG, seed=1)
    checker = PrecisionChecker(model, PrecisionCheckConfig.parse(
        f"level=1,output_md5=true,save_tensors=true,output_path={tmp_path}"))
    one_step(model, checker)
    x = it.from_numpy(np.random.default_rng(0).integers(0, 300, (2, 16)))
    model(x)  # outside a step: not checked
    checker.close()
    log = (tmp_path / "precision_check_rank_0.log").read_text()
    line = next(ln for ln in log.splitlines() if "transformer.h.0.mlp.c_fc_0_forward" in ln)
    a = np.load(tmp_path / "rank_0" / "step_1" / "transformer.h.0.mlp.c_fc_0_forward.npy")
    assert a.shape == (2, 16, 64) and f"md5={hashlib.md5(a.tobytes()).hexdigest()}" in line
    assert f"min={a.min():.6g}" in line and f"max={a.max():.6g}" in line and "[NaN:0 Inf:0]" in line
    assert "transformer.h.1_0_backward" in log and "lm_head_0_backward" in log  # gradients too
    assert "_1_forward" not in log  # one micro-batch: each module ran once; the later forward was outside
    assert "no NaN/Inf" in log


@pytest.mark.parametrize("level,where", [(1, "transformer.h.1.mlp.c_fc_0_forward"),
                                         (2, "transformer.h.1.mlp.c_fc/Linear_0_forward")])
def test_the_first_nan_is_named_where_it_appears(tmp_path, level, where):
    model = GPT2(CFG, seed=1)
    with it.no_grad():
        model.transformer.h[1].mlp.c_fc.weight[3, 2] = float("nan")
    checker = PrecisionChecker(model, PrecisionCheckConfig.parse(f"level={level},output_path={tmp_path}"))
    one_step(model, checker)
    assert checker.first_nonfinite.startswith(f"step 1, {where} ("), checker.first_nonfinite
    assert "<- ERROR" in (tmp_path / "precision_check_rank_0.log").read_text()
    checker.close()


def test_compare_names_the_first_tensor_that_differs(tmp_path):
    base = GPT2(CFG, seed=1)
    checker = PrecisionChecker(base,
                               PrecisionCheckConfig.parse(f"level=1,save_tensors=true,output_path={tmp_path / 'a'}"))
    one_step(base, checker)
    checker.close()
    same = GPT2(CFG, seed=1)
    checker = PrecisionChecker(same, PrecisionCheckConfig.parse(f"level=1,baseline={tmp_path / 'a'},"
                                                                f"output_path={tmp_path / 'b'}"))
    one_step(same, checker)
    assert checker.diverged == 0 and checker.compared > 40 and checker.first_divergence is None
    checker.close()
    other = GPT2(CFG, seed=1)
    with it.no_grad():
        other.transformer.h[1].mlp.c_proj.weight[0, 0] += 1e-3
    checker = PrecisionChecker(other, PrecisionCheckConfig.parse(f"level=1,baseline={tmp_path / 'a'},"
                                                                 f"output_path={tmp_path / 'c'}"))
    one_step(other, checker)
    assert checker.first_divergence.startswith("step 1, transformer.h.1.mlp.c_proj_0_forward:"), \
        checker.first_divergence
    summary = checker.close()
    assert "first divergence: step 1, transformer.h.1.mlp.c_proj_0_forward" in summary


def test_the_tolerance_follows_the_reduction_not_the_element(tmp_path):
    """A summation order's round-off, relative to a tensor's scale, passes (it failed the former
    elementwise rtol 1e-5 / atol 1e-6 on elements near zero, which an explicit rtol/atol still
    applies); an activation scaled by 1 + 1e-3 is named where it happens."""
    base = GPT2(CFG, seed=1)
    checker = PrecisionChecker(base,
                               PrecisionCheckConfig.parse(f"level=1,save_tensors=true,output_path={tmp_path / 'a'}"))
    one_step(base, checker)
    checker.close()
    # the bound: u float32, K the LM head's (padded) 384 outputs, D twice the model's leaf modules
    leaves = sum(1 for m in base.modules() if next(m.children(), None) is None)
    assert (checker.reduction, checker.depth) == (CFG.padded_vocab_size, 2 * leaves) == (384, 32)
    assert checker.tolerance(2.0, steps=3) == pytest.approx(3 * np.sqrt(2 * leaves) * (2 + np.sqrt(384)) * 2**-24 * 2)
    # another summation order: every element moved by 3 u * sqrt(K) of its tensor's scale
    rng = np.random.default_rng(0)
    for f in (tmp_path / "a" / "rank_0" / "step_1").glob("*.npy"):
        b = np.load(f)
        np.save(f, (b + rng.choice([-1, 1], b.shape) * 3 * 2**-24 * np.sqrt(384) * np.abs(b).max()).astype(b.dtype))
    for rule, diverged in (("", 0), (",rtol=1e-5,atol=1e-6", 1)):
        same = GPT2(CFG, seed=1)
        checker = PrecisionChecker(same, PrecisionCheckConfig.parse(f"level=1,baseline={tmp_path / 'a'},"
                                                                    f"output_path={tmp_path / 'b'}{rule}"))
        one_step(same, checker)
        assert checker.compared > 40 and (checker.diverged > 0) == diverged, checker.close()
        assert checker.worst > 1 if diverged else 0.1 < checker.worst < 1, checker.worst
        summary = checker.close()
        assert ("rtol 1e-05 / atol 1e-06" if rule else "beyond the round-off bound (u 5.96e-08") in summary, summary
    scaled = GPT2(CFG, seed=1)
    scaled.transformer.h[1].mlp.c_fc.register_forward_hook(lambda m, args, out: out * (1 + 1e-3))
    checker = PrecisionChecker(scaled, PrecisionCheckConfig.parse(f"level=1,baseline={tmp_path / 'a'},"
                                                                  f"output_path={tmp_path / 'c'}"))
    one_step(scaled, checker)
    assert checker.first_divergence.startswith("step 1, transformer.h.1.mlp.c_fc_0_forward: max |diff|"), \
        checker.first_divergence
    checker.close()


@pytest.mark.mpi
def test_parallel_runs_against_a_one_process_baseline(tmp_path):
    """The example's front door: a one-process run saves its tensors; DP 2 (micro-batches mapped,
    gradients scaled), TP 2 (shards skipped) and ZeRO-3 with full recomputation (replays not
    counted as forwards) compare silently; a DP 2 run from perturbed
    weights names the first module whose output differs."""
    from infinitrain.data import write_shard
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 300), 40))
    args = ["--input_bin", tmp_path / "t.bin", "--model", "tiny", "--batch_size", "2", "--sequence_length", "32",
            "--num_iteration", "2", "--total_batch_size", "256"]
    example(1, "gpt2", args + ["--precision_check", f"level=1,save_tensors=true,output_path={tmp_path / 'one'}"])
    for n, extra in ((2, []), (2, ["--tensor_parallel", "2"]), (2, ["--pipeline_parallel", "2"]),
                     (2, ["--zero_stage", "3", "--recompute", "full"])):
        out = example(n, "gpt2", args + [*extra, "--precision_check",
                                         f"level=1,baseline={tmp_path / 'one'},output_path={tmp_path / 'par'}"])
        counts = re.findall(r"(\d+) tensors compared with .*?, (\d+) beyond .*?, (\d+) skipped", out)
        assert len(counts) == 2, out
        for compared, diverged, skipped in counts:
            assert int(compared) > 100 and diverged == "0", out
            # TP shards are skipped and counted; a recomputation's replay is not checked twice
            assert (int(skipped) > 0) == ("--tensor_parallel" in extra), out
    bad = example(2, "gpt2", args + ["--learning_rate", "1e-1", "--precision_check",
                                     f"level=1,baseline={tmp_path / 'one'},output_path={tmp_path / 'bad'}"],
                  check=False)
    assert bad.returncode == 0, bad.stderr  # step 1 equal; step 2 starts from other weights
    assert "first divergence from the baseline: step 2, transformer.wte_0_forward" in bad.stderr, bad.stderr


@pytest.mark.mpi
def test_tensor_parallel_round_off_is_no_divergence_and_a_wrong_weight_is(tmp_path):
    """bfloat16 GPT-2 tiny at TP 2 against one process: the reduction order's round-off (which
    the former elementwise rtol 1e-5 / atol 1e-6 named, at the first backward) passes; a wrong
    weight in rank 1's columns of h.1's MLP projection is named there, at step 1."""
    from infinitrain.data import write_shard
    from infinitrain.models.gpt2 import PRESETS
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 300), 40))
    model = GPT2(PRESETS["tiny"], seed=3)
    model.save_llmc(tmp_path / "good.bin")
    with it.no_grad():  # a row-parallel weight: input feature 200 of 256 lives on rank 1
        model.transformer.h[1].mlp.c_proj.weight[5, 200] += 0.1
    model.save_llmc(tmp_path / "wrong.bin")
    args = ["--input_bin", tmp_path / "t.bin", "--batch_size", "2", "--sequence_length", "32", "--num_iteration", "2",
            "--total_batch_size", "128", "--dtype", "bfloat16", "--precision_check"]
    example(1, "gpt2", ["--llmc_filepath", tmp_path / "good.bin", *args,
                        f"level=1,save_tensors=true,output_path={tmp_path / 'one'}"])
    out = example(2, "gpt2", ["--llmc_filepath", tmp_path / "good.bin", "--tensor_parallel", "2", *args,
                              f"level=1,baseline={tmp_path / 'one'},save_tensors=true,output_path={tmp_path / 'tp'}"])
    counts = re.findall(r"(\d+) tensors compared with .*?, (\d+) beyond the round-off bound .*?"
                        r"the largest \|diff\| was ([\d.e+-]+) of its tolerance", out)
    assert len(counts) == 2 and all(int(n) > 100 and bad == "0" and float(worst) < 0.5 for n, bad, worst in counts), out
    # the former rule named this round-off: rank 0's first backward tensors, elementwise
    mine, theirs = tmp_path / "tp" / "rank_0" / "step_1", tmp_path / "one" / "rank_0" / "step_1"
    a, b = (np.load(d / "transformer.ln_f_0_backward.npy") for d in (mine, theirs))
    assert not np.isclose(a, b, rtol=1e-5, atol=1e-6).all() and np.abs(a - b).max() > 0
    bad = example(2, "gpt2", ["--llmc_filepath", tmp_path / "wrong.bin", "--tensor_parallel", "2", *args,
                              f"level=1,baseline={tmp_path / 'one'},output_path={tmp_path / 'bad'}"], check=False)
    assert bad.returncode == 0, bad.stderr
    for rank in (0, 1):
        assert (f"precision check (rank {rank}): first divergence from the baseline: step 1, "
                "transformer.h.1.mlp.c_proj_0_forward: max |diff|") in bad.stderr, bad.stderr
