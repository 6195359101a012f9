"""Loss curves (parsed from the examples' logs, drawn to a PNG) and the MFU figure of the log
line (llm.c's FLOP count against a given or measured peak)."""
import re
import struct

import numpy as np
import pytest

from infinitrain.examples import mfu
from infinitrain.models import GPT2
from infinitrain.models.gpt2 import PRESETS
from infinitrain.plot import main as plot_main
from infinitrain.plot import parse_log, plot_losses
from helpers import example

LOG = """MFU against a peak of 100.0 GFLOP/s per rank
val loss 10.900000
step    1/3 | train loss 10.800000 | lr 1.00e-04 | (1.0 ms | 1 tok/s | MFU 1.0% | peak used: 1 MB | DP=1)
step    2/3 | train loss 9.500000 | lr 1.00e-04 | (1.0 ms | 1 tok/s | MFU 1.0% | peak used: 1 MB | DP=1)
val loss 9.700000
step    3/3 | train loss 9.100000 | lr 1.00e-04 | (1.0 ms | 1 tok/s | MFU 1.0% | peak used: 1 MB | DP=1)
val loss 9.300000
"""


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow
def test_logs_parse_and_draw(tmp_path):
    curves = parse_log(LOG)
    assert curves == {"train": [(1, 10.8), (2, 9.5), (3, 9.1)], "val": [(0, 10.9), (2, 9.7), (3, 9.3)]}
    plot_losses({"one": curves, "other": parse_log(LOG.replace("9.1", "8.9"))}, tmp_path / "l.png")
    assert png_size(tmp_path / "l.png") == (800, 450)
    (tmp_path / "a.log").write_text(LOG)
    assert plot_main([str(tmp_path / "a.log"), "-o", str(tmp_path / "cli.png")]) == 0
    assert (tmp_path / "cli.png").stat().st_size > 5000
    (tmp_path / "empty.log").write_text("nothing here\n")
    with pytest.raises(SystemExit, match="no losses to plot"):
        plot_main([str(tmp_path / "empty.log"), "-o", str(tmp_path / "x.png")])
    with pytest.raises(SystemExit, match="cannot read"):
        plot_main([str(tmp_path / "missing.log")])


def test_flops_per_token_is_llmc_count():
    cfg = PRESETS["gpt2"]
    n = GPT2._llmc_numel(cfg)
    assert n == 124_475_904  # llm.c's GPT-2 124M (padded vocabulary)
    assert mfu.flops_per_token(n, 12, 768, 1024) == 6 * n + 6 * 12 * 768 * 1024


@pytest.mark.slow
def test_example_logs_mfu_and_draws_its_curves(tmp_path):
    from infinitrain.data import write_shard
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 300), 40))
    out = example(1, "gpt2", ["--input_bin", tmp_path / "t.bin", "--input_val_bin", tmp_path / "t.bin",
                              "--val_loss_every", "2", "--val_max_steps", "1", "--model", "tiny", "--batch_size", "2",
                              "--sequence_length", "32", "--num_iteration", "3", "--peak_tflops", "0.05",
                              "--plot", tmp_path / "loss.png"])
    n = GPT2._llmc_numel(PRESETS["tiny"])
    for ms, shown in re.findall(r"\(([\d.]+) ms \| \d+ tok/s \| MFU ([\d.]+)%", out):
        want = mfu.flops_per_token(n, 2, 64, 32) * 64 / (float(ms) / 1e3) / 0.05e12 * 100
        assert abs(float(shown) - want) <= 0.05 + 1e-3 * want, (shown, want)
    assert png_size(tmp_path / "loss.png") == (800, 450)
    assert [s for s, _ in parse_log(out)["val"]] == [0, 2, 3]  # before training, after step 2, at the end


@pytest.mark.slow
def test_the_mfu_peak_is_kept_for_the_run_and_a_step_above_it_is_said_once(tmp_path):
    """A peak below what the steps reach (measured on a busy machine, or given too low) stays
    the peak, so that the run's figures compare with each other and with other runs given the same
    peak: MFU shows above 100%, and a note says why once."""
    from infinitrain.data import write_shard
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 300), 40))
    out = example(1, "gpt2", ["--input_bin", tmp_path / "t.bin", "--model", "tiny", "--batch_size", "2",
                              "--sequence_length", "32", "--num_iteration", "3", "--peak_tflops", "1e-6"])
    n = GPT2._llmc_numel(PRESETS["tiny"])
    steps = re.findall(r"\(([\d.]+) ms \| \d+ tok/s \| MFU ([\d.]+)%", out)
    assert len(steps) == 3, out
    for ms, shown in steps:  # against the given peak, every step
        want = mfu.flops_per_token(n, 2, 64, 32) * 64 / (float(ms) / 1e3) / 1e-6 / 1e12 * 100
        assert float(shown) > 100.0 and abs(float(shown) - want) <= 0.05 + 1e-3 * want, (shown, want)
    assert out.count("note: step") == 1 and "note: step 1 ran at" in out and "--peak_tflops fixes it" in out


def test_measured_peak_is_a_plausible_number():
    flops = mfu.measure_peak_flops("float32", size=256, repeats=2)
    assert 1e8 < flops < 1e13


@pytest.mark.parametrize("prefix", ["[0] ", "[1,0]<stdout>:", "0: "])
def test_logs_behind_a_launchers_rank_prefix_parse_the_same(prefix):
    """mpi_launch and Hydra prefix "[0] ", Open MPI's --tag-output "[1,0]<stdout>:", srun --label
    "0: "; other ranks' lines are not the log."""
    prefixed = "\n".join(prefix + line for line in LOG.splitlines())
    assert parse_log(prefixed) == parse_log(LOG) and parse_log(prefixed)["train"]
    assert parse_log(prefixed.replace(prefix, prefix.replace("0", "1", 1)))["train"] == []
