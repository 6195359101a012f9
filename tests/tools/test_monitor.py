"""The Monitor (infinitrain.monitor: TensorBoard event files and CSV rows), read back with
TensorBoard's own reader, the examples' --tensorboard_dir / --csv_log, and the progress bar
(infinitrain.io.progress): drawn on a terminal on rank 0, the plain iterable anywhere else."""
from __future__ import annotations

import csv
import importlib.util
import io
import re
import sys

import numpy as np
import pytest

from infinitrain import io as it_io
from infinitrain.monitor import Monitor, MonitorError
from helpers import example, write_tokens


def scalars(log_dir) -> dict:
    """{tag: [(step, value)]} of the event files in log_dir, as TensorBoard reads them."""
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(log_dir), size_guidance={accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_monitor_writes_events_tensorboard_reads_and_csv_rows(tmp_path):
    pytest.importorskip("tensorboardX")
    with Monitor(tmp_path / "runs", "job", csv_path=tmp_path / "m.csv") as m:
        for step in (1, 2, 3):
            m.log(step, train_loss=10.0 / step, lr=1e-3 * step, grad_norm=None)  # None: left out
        m.log(3, val_loss=2.5)
    got = scalars(tmp_path / "runs" / "job")
    assert sorted(got) == ["lr", "train_loss", "val_loss"]
    assert [s for s, _ in got["train_loss"]] == [1, 2, 3]
    np.testing.assert_allclose([v for _, v in got["train_loss"]], [10.0, 5.0, 10.0 / 3], rtol=1e-6)
    assert got["val_loss"] == [(3, 2.5)]
    rows = list(csv.reader((tmp_path / "m.csv").open()))
    assert rows[0] == ["step", "name", "value"] and len(rows) == 1 + 7
    assert rows[1:3] == [["1", "train_loss", "10.0"], ["1", "lr", "0.001"]] and rows[-1] == ["3", "val_loss", "2.5"]
    # a resumed run appends under the one header
    with Monitor(csv_path=tmp_path / "m.csv") as m:
        m.log(4, train_loss=1.0)
    rows = list(csv.reader((tmp_path / "m.csv").open()))
    assert rows.count(["step", "name", "value"]) == 1 and rows[-1] == ["4", "train_loss", "1.0"]


def test_monitor_off_rank_writes_nothing_and_bad_places_are_refused(tmp_path, monkeypatch):
    m = Monitor(csv_path=tmp_path / "m.csv", enabled=False)  # another rank: nothing written
    m.log(1, train_loss=1.0)
    m.close()
    assert not (tmp_path / "m.csv").exists() and not m.active
    with pytest.raises(MonitorError, match="is a folder"):
        Monitor(csv_path=tmp_path)
    # the library missing: refused at start, on every rank (looked for, not imported, where it
    # would not write), so that all stop together
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(MonitorError, match=re.escape("pip install 'infinitrain[tensorboard]'")):
        Monitor(tmp_path / "runs")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(MonitorError, match=re.escape("pip install 'infinitrain[tensorboard]'")):
        Monitor(tmp_path / "runs", enabled=False)
    assert not (tmp_path / "runs").exists()


def test_monitor_from_deepspeed_config_blocks(tmp_path):
    pytest.importorskip("tensorboardX")
    m = Monitor.from_deepspeed_config({"enabled": True, "output_path": str(tmp_path), "job_name": "ds"},
                                      {"enabled": True, "output_path": str(tmp_path / "csv")})
    m.log(1, train_loss=3.0)
    m.close()
    assert scalars(tmp_path / "ds")["train_loss"] == [(1, 3.0)]
    assert (tmp_path / "csv" / "DeepSpeedJobName" / "metrics.csv").read_text().splitlines()[-1] == "1,train_loss,3.0"
    assert not Monitor.from_deepspeed_config({"enabled": False, "output_path": str(tmp_path)}).active


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_the_plain_iterable_without_a_terminal_and_draws_on_one(monkeypatch):
    items = range(5)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log file or pipe
    assert it_io.progress(items, desc="x") is items
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert list(it_io.progress(items, total=5, desc="tokenizing")) == list(items)
    assert "tokenizing:   0%" in terminal.getvalue() and "0/5" in terminal.getvalue()  # (drawn, then cleared)
    monkeypatch.setattr(it_io, "process_rank", lambda: 1)  # another rank: quiet on a terminal too
    assert it_io.progress(items) is items
    monkeypatch.undo()
    monkeypatch.setattr(sys, "stderr", _Terminal())
    monkeypatch.setenv("PMI_RANK", "1")  # before MPI is up, the launcher's variables say which rank
    if "mpi4py.MPI" not in sys.modules or not sys.modules["mpi4py.MPI"].Is_initialized():
        assert it_io.progress(items) is items


@pytest.mark.slow
def test_example_tensorboard_and_csv_hold_the_printed_losses(tmp_path):
    """The GPT-2 example with --tensorboard_dir and --csv_log: the events hold the step lines'
    losses, and the CSV the same scalars."""
    pytest.importorskip("tensorboardX")
    write_tokens(tmp_path / "t.bin")
    out = example(1, "gpt2", ["--input_bin", tmp_path / "t.bin", "--input_val_bin", tmp_path / "t.bin",
                              "--model", "tiny", "--batch_size", "2", "--sequence_length", "32",
                              "--num_iteration", "3", "--val_loss_every", "2", "--val_max_steps", "2",
                              "--grad_clip", "1.0", "--peak_tflops", "1", "--tensorboard_dir", tmp_path / "tb",
                              "--csv_log", tmp_path / "m.csv"])
    printed = [float(v) for v in re.findall(r"train loss (\S+) \|", out)]
    val = [float(v) for v in re.findall(r"^val loss (\S+)$", out, re.M)]
    got = scalars(tmp_path / "tb")
    assert {"train_loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "mfu", "peak_used_mb",
            "peak_reserved_mb"} <= set(got)
    assert [s for s, _ in got["train_loss"]] == [1, 2, 3] and [s for s, _ in got["val_loss"]] == [0, 2, 3]
    np.testing.assert_allclose([v for _, v in got["train_loss"]], printed, atol=1e-6)
    np.testing.assert_allclose([v for _, v in got["val_loss"]], val, atol=1e-6)
    rows = list(csv.DictReader((tmp_path / "m.csv").open()))
    np.testing.assert_allclose([float(r["value"]) for r in rows if r["name"] == "train_loss"], printed, atol=1e-6)
