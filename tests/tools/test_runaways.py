"""Sizes read from a flag or a file are bounded by the machine's memory before anything is
allocated for them (issue 50's runaways: each grew the process until the kernel killed it)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from infinitrain.io import DataFormatError
from infinitrain.nn.parallel import Layout, ParallelPlan
from infinitrain.plot import main as plot_main, read_log


@pytest.mark.parametrize("total", [int(3.2e19), 10**30])
def test_a_global_batch_larger_than_memory_is_refused(total, capsys):
    from infinitrain.examples.lm_train import accumulation_steps
    args = SimpleNamespace(batch_size=4, sequence_length=64, total_batch_size=total)
    with pytest.raises(SystemExit):
        accumulation_steps(args, ParallelPlan(Layout(2)))
    err = capsys.readouterr().err
    assert f"--total_batch_size {total}" in err and "GiB" in err and "smaller global batch" in err


def test_a_sane_global_batch_is_accumulated():
    from infinitrain.examples.lm_train import accumulation_steps
    args = SimpleNamespace(batch_size=4, sequence_length=64, total_batch_size=4 * 64 * 2 * 8)
    assert accumulation_steps(args, ParallelPlan(Layout(2))) == 8


def test_a_transformers_config_with_a_huge_model_is_refused_before_it_is_listed(tmp_path):
    from infinitrain.models import GPT2
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 2**24,
         "n_head": 12}))
    with pytest.raises(DataFormatError, match="parameters in float32\\) would need .* GiB"):
        GPT2.from_pretrained(tmp_path)


def test_a_beam_larger_than_memory_is_refused_before_decoding():
    from infinitrain.models.seq2seq import SEQ2SEQ_PRESETS, Seq2SeqConfig, Seq2SeqTransformer
    config = Seq2SeqConfig(vocab_size=8000, **SEQ2SEQ_PRESETS["small"])
    Seq2SeqTransformer.check_beam(config, 4, 64)
    with pytest.raises(MemoryError, match="beam of 10000000 .* smaller beam"):
        Seq2SeqTransformer.check_beam(config, 10_000_000, 64)


def test_plotting_a_file_that_is_not_a_log_is_refused_not_read_whole():
    with pytest.raises(ValueError, match="not a training log"):
        read_log("/dev/zero")
    with pytest.raises(SystemExit, match="/dev/zero: line 1 is longer"):
        plot_main(["/dev/zero", "-o", "/dev/null"])


def test_a_log_read_line_by_line_is_the_log_parsed_whole(tmp_path):
    from infinitrain.plot import parse_log
    text = ("val loss 5.0\nstep 1/3 | train loss 4.5 | lr 1e-3\nstep 2/3 | train loss 4.0\n"
            "val loss 4.2\n[0] step 3/3 | train loss 3.5\nval loss 3.9\n")
    (tmp_path / "run.log").write_text(text)
    assert read_log(tmp_path / "run.log") == parse_log(text) == {
        "train": [(1, 4.5), (2, 4.0), (3, 3.5)], "val": [(0, 5.0), (2, 4.2), (3, 3.9)]}
