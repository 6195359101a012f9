"""Scalars per step (losses, learning rate, gradient norm, throughput, MFU, memory) written where a
person watches a run: TensorBoard event files, through tensorboardX (`pip install
'infinitrain[tensorboard]'`), and a CSV file. Rank 0 writes; the other ranks hold a Monitor that
does nothing, so that every rank can call it alike.

    monitor = Monitor("runs", "gpt2-d12", csv_path="metrics.csv", enabled=env.is_main)
    monitor.log(step, train_loss=loss, lr=lr)
    monitor.close()

    tensorboard --logdir runs

DeepSpeed's `tensorboard` and `csv_monitor` config blocks ({enabled, output_path, job_name})
map onto the constructor: from_deepspeed_config.
"""
from __future__ import annotations

import csv
import math
import os
from pathlib import Path

TENSORBOARD_INSTALL = "pip install 'infinitrain[tensorboard]'"  # (tensorboardX: writes the files without torch)


class MonitorError(RuntimeError):
    """A monitor that cannot write: its library missing, its folder or file not writable."""


def _summary_writer(writes: bool):
    """tensorboardX's SummaryWriter where this process writes; elsewhere only whether it is
    installed (importing it imports torch where that is installed: seconds and memory on
    every rank for nothing)."""
    import importlib.util
    try:
        if not writes:
            if importlib.util.find_spec("tensorboardX") is None:
                raise ImportError("No module named 'tensorboardX'")
            return None
        from tensorboardX import SummaryWriter
    except ImportError as e:
        raise MonitorError(f"TensorBoard event files need tensorboardX ({e}): "
                           f"{TENSORBOARD_INSTALL}") from None
    return SummaryWriter


class Monitor:
    """Writes each log(step, name=value, ...) call's scalars to TensorBoard event files under
    output_path/job_name (output_path itself without a job name) and/or as rows
    `step,name,value` of csv_path (a header once, flushed row by row, so a run killed midway
    keeps every row before it). Either may be None. Everything a run would fail on later (the
    library, the folders) is checked here, on every rank alike, before training starts."""

    COLUMNS = ("step", "name", "value")

    def __init__(self, output_path=None, job_name: str = "", csv_path=None, enabled: bool = True):
        self.log_dir = Path(output_path, job_name) if output_path is not None else None
        self.csv_path = Path(csv_path) if csv_path is not None else None
        self._events = self._csv_file = self._csv = None
        writer = _summary_writer(enabled) if self.log_dir is not None else None  # missing anywhere: all refuse
        if not enabled:
            return
        try:
            if writer is not None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                self._events = writer(logdir=str(self.log_dir), flush_secs=10)
            if self.csv_path is not None:
                if self.csv_path.is_dir():
                    raise MonitorError(f"the CSV log {self.csv_path} is a folder; give a file name (such as "
                                       f"{self.csv_path / 'metrics.csv'})")
                self.csv_path.parent.mkdir(parents=True, exist_ok=True)
                fresh = not self.csv_path.exists() or self.csv_path.stat().st_size == 0
                # appended to: a resumed run's rows follow the first run's, under one header
                self._csv_file = open(self.csv_path, "a", newline="", encoding="utf-8")
                self._csv = csv.writer(self._csv_file)
                if fresh:
                    self._write_row(self.COLUMNS)
        except OSError as e:
            self.close()
            where = e.filename or self.log_dir or self.csv_path
            raise MonitorError(f"cannot write the metrics to {where}: {e.strerror or e}") from None

    @classmethod
    def from_deepspeed_config(cls, tensorboard: dict | None = None, csv_monitor: dict | None = None,
                              enabled: bool = True) -> "Monitor":
        """DeepSpeed's `tensorboard` and `csv_monitor` blocks (each {enabled, output_path, job_name};
        job_name defaults to DeepSpeedJobName as there): events under output_path/job_name, the
        CSV rows in output_path/job_name/metrics.csv. Unlike DeepSpeed, an empty output_path is the
        current folder (not one under the home folder), and one CSV file holds every scalar, a row
        each (DeepSpeed writes a file per scalar)."""
        def place(block):
            if not block or not block.get("enabled", False):
                return None
            return Path(block.get("output_path") or "."), block.get("job_name") or "DeepSpeedJobName"
        events, rows = place(tensorboard), place(csv_monitor)
        return cls(*(events or (None, "")), csv_path=Path(*rows) / "metrics.csv" if rows else None, enabled=enabled)

    @property
    def active(self) -> bool:
        """Whether this process writes anything (rank 0 with a destination)."""
        return self._events is not None or self._csv is not None

    def log(self, step: int, **scalars) -> None:
        """Each name=value (a number; None is left out) as a point of its own curve at step."""
        if not self.active:
            return
        for name, value in scalars.items():
            if value is None:
                continue
            value = float(value)
            if self._events is not None:
                self._events.add_scalar(name, value, int(step))
            if self._csv is not None:
                self._write_row((int(step), name, repr(value) if math.isfinite(value) else str(value)))
        if self._events is not None:  # each step's points on disk now: a killed run keeps them
            self._events.flush()

    def _write_row(self, row) -> None:
        self._csv.writerow(row)
        self._csv_file.flush()

    def flush(self) -> None:
        if self._events is not None:
            self._events.flush()
        if self._csv_file is not None:
            self._csv_file.flush()
            os.fsync(self._csv_file.fileno())

    def close(self) -> None:
        """Flushes and closes the files (a second close does nothing)."""
        if self._events is not None:
            self._events.close()
            self._events = None
        if self._csv_file is not None:
            self._csv_file.close()
            self._csv_file = self._csv = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
