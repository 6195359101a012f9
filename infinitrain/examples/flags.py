"""Argument types for the examples' flags: a value that makes no sense is refused when the
flags are read, with the flag's name, instead of training nonsense (a negative batch, a NaN
learning rate) or failing later with a ZeroDivisionError. check_input_files does the same for
the files the flags name."""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from infinitrain.io import process_rank
from infinitrain.nn.parallel.plan import ParallelPlan


def _number(kind, low, low_ok: bool, what: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if value < low or (value == low and not low_ok):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value
    parse.__name__ = what  # argparse names the type in its messages
    return parse


positive_int = _number(int, 1, True, "a positive integer")
nonnegative_int = _number(int, 0, True, "0 or a positive integer")
positive_float = _number(float, 0.0, False, "a positive number")
nonnegative_float = _number(float, 0.0, True, "0 or a positive number")
unit_interval = _number(float, 0.0, True, "in [0, 1)")


def add_async_tp_flag(p: argparse.ArgumentParser) -> None:
    """Megatron's switch for the column-parallel backward's overlap (both examples take it)."""
    p.add_argument("--no_async_tensor_model_parallel_allreduce", action="store_true",
                   help="with --tensor_parallel > 1: run backward's TP collectives after the products "
                        "instead of beside them (Megatron's flag; the results are the same bits)")


def add_monitor_flags(p: argparse.ArgumentParser) -> None:
    """Where the per-step scalars go besides the log lines (every example takes them; open_monitor)."""
    p.add_argument("--tensorboard_dir", default=None, metavar="DIR",
                   help="write TensorBoard event files of the losses, learning rate, gradient norm, throughput "
                        "and memory per step to DIR (tensorboard --logdir DIR; needs "
                        "pip install 'infinitrain[tensorboard]')")
    p.add_argument("--csv_log", default=None, metavar="FILE",
                   help="write the same scalars as CSV rows step,name,value to FILE (appended to)")


def open_monitor(args, env):
    """The run's Monitor of --tensorboard_dir and --csv_log (writing on rank 0), opened before
    training: a missing library or an unwritable place ends the job at start, saying which."""
    from infinitrain.monitor import Monitor, MonitorError
    blocks = {k: v for k, v in (getattr(args, "monitor", None) or {}).items() if v.get("enabled")}
    if blocks and (args.tensorboard_dir or args.csv_log):
        refuse(f"--tensorboard_dir / --csv_log and --deepspeed_config's {' and '.join(blocks)} both say where the "
               "metrics go: give one of them")
    try:
        if blocks:  # a DeepSpeed config's tensorboard / csv_monitor blocks
            return Monitor.from_deepspeed_config(blocks.get("tensorboard"), blocks.get("csv_monitor"),
                                                 enabled=env.is_main)
        return Monitor(args.tensorboard_dir, csv_path=args.csv_log, enabled=env.is_main)
    except MonitorError as e:
        # (the library is looked for on every rank: all refuse together; a place, on rank 0 alone)
        refuse(f"--tensorboard_dir / --csv_log: {e}")


def add_nan_check_flag(p: argparse.ArgumentParser) -> None:
    """Megatron's check_for_nan_in_loss_and_grad, on by default in every example."""
    p.add_argument("--check_for_nan_in_loss_and_grad", action="store_true", default=True,
                   help="stop at a NaN or infinite loss or gradient norm (the default, as Megatron)")
    p.add_argument("--no_check_for_nan_in_loss_and_grad", dest="check_for_nan_in_loss_and_grad",
                   action="store_false", help="train on through NaN/inf")


def stop_if_not_finite(args, env, model, step: int, what: str, value: float) -> None:
    """Megatron's check_for_nan_in_loss_and_grad (on by default in every example): a NaN or
    infinite loss or gradient norm ends the run with a message and exit code 1 instead of
    training on garbage. The value must be the same on every rank (a mean over the job), so
    every rank stops here together; the message names the first tensor that is not finite."""
    if not args.check_for_nan_in_loss_and_grad or math.isfinite(value):
        return
    found = [f for f in env.comm.gather(_first_not_finite(model, env.rank), root=0) or [] if f]
    if env.is_main:
        where = (f"the first tensor that is not: {found[0]}" if found else
                 "every weight and gradient is finite, so an activation overflowed (--precision_check "
                 "level=1 names the first module whose output is not finite, in the language-model examples)")
        print(f"step {step}: the {what} is {value}; {where}. Training diverged (or the data or weights "
              "hold NaN/inf): lower --learning_rate or set --grad_clip; "
              "--no_check_for_nan_in_loss_and_grad trains on regardless", file=sys.stderr, flush=True)
    sys.exit(1)


def _first_not_finite(model, rank: int) -> str | None:
    """This rank's first parameter or gradient, in model order, holding a NaN or inf (read
    only once the run has failed: a pass over every tensor)."""
    import numpy as np
    for name, p in model.named_parameters():
        for label, t in ((name, p), (f"{name}.grad", p.grad)):
            if t is not None and t.numel() and not np.isfinite(t.detach().float().cpu().numpy()).all():
                return f"{label} (rank {rank})"
    return None


def probability(text: str) -> float:
    value = unit_interval(text)
    if value >= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def check_input_files(env, checks) -> None:
    """checks: (flag, path or None, a reader that raises on a bad file). Rank 0 opens each file
    before anything is built; a missing, truncated or foreign one ends the job with one line
    naming the flag, printed once (every rank exits 1)."""
    from ..io import DataFormatError
    problem = None
    if env.is_main:
        for flag, path, read in checks:
            if path is None:
                continue
            try:
                read(path)
            except (DataFormatError, OSError) as e:
                problem = f"{flag}: {e}"
                break
    problem = env.comm.bcast(problem, root=0)
    if problem:
        refuse(problem)


def plan_of(env, **options):
    """The job's ParallelPlan (nn.parallel.plan) of these options, refused (once, from rank 0)
    where they cannot work together; --offload_path's folder checked on disk (its free space is
    the memory plan's to check)."""
    try:
        plan = ParallelPlan(env, **options)
    except ValueError as e:
        refuse(str(e))
    if plan.offload_optimizer == "nvme":
        path = Path(plan.offload_path)
        if not path.is_dir():
            refuse(f"--offload_path {path}: no such folder (make it, mkdir -p, or name another)")
        if not os.access(path, os.W_OK | os.X_OK):
            refuse(f"--offload_path {path}: not writable by this user (name another folder)")
    return plan


def refuse(message: str):
    """Ends the job over something every rank finds the same (flags that cannot work together,
    a file rank 0 checked): the message once, from rank 0, and exit code 1 everywhere. The other
    ranks wait a moment first, so that the launcher does not stop rank 0 before it has spoken."""
    import time
    if process_rank() == 0:
        print(message, file=sys.stderr, flush=True)
    else:
        time.sleep(2.0)
    sys.exit(1)


def check_writable_file(flag: str, path) -> None:
    """Exits with a message unless a file can be written at path (its folder must exist)."""
    import os
    if os.path.isdir(path):
        example = os.path.join(path, "trace.json" if flag == "--profile" else "loss.png")
        sys.exit(f"{flag} {path} is a folder; give a file name (such as {example})")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        sys.exit(f"{flag} {path}: the folder {folder} does not exist or is not writable")


def check_outputs(folders=(), files=(), plot=None) -> None:
    """Every output a job will write, checked before it trains: (flag, folder) checkpoint folders
    writable, (flag, path) files writable where named, matplotlib there for --plot."""
    from ..checkpoint import CheckpointError, ensure_writable
    for flag, folder in folders:
        try:
            if folder:
                ensure_writable(folder)
        except CheckpointError as e:
            sys.exit(f"{flag}: {e}")
    for flag, path in files:
        if path:
            check_writable_file(flag, path)
    if plot:
        from ..plot import pyplot
        try:
            pyplot()
        except RuntimeError as e:
            refuse(f"--plot: {e}")


def run_example(main) -> None:
    """An example's entry point: its exit code, with a rank that leaves a multi-rank job on an
    error ending the whole job (exit_job), whether it returned the code or raised SystemExit."""
    from infinitrain.nn.parallel.global_env import exit_job
    try:
        code = main()
    except SystemExit as e:
        code = e.code
    exit_job(code)
