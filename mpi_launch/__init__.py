"""mpi_launch: torchrun-style flags on top of mpiexec.

    mpi_launch --nproc_per_node 4 -m infinitrain.examples.gpt2 --model small
    mpi_launch --nnodes 2 --nproc_per_node 8 --hostfile hosts train.py ...

Each rank gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) and OMP_NUM_THREADS = cores / local ranks unless it is set; output
lines are prefixed with the rank; the exit code is the job's (non-zero if any rank failed).
With --max_restarts N a failed job is started again, whole, up to N times (torchrun's flag):
each run gets TORCHELASTIC_RESTART_COUNT (0 first) and TORCHELASTIC_MAX_RESTARTS, and the
examples then resume from their --save folder's latest checkpoint by themselves.
mpiexec is the one next to this Python (the mpich wheel's) unless --mpiexec or $MPIEXEC names
another, such as a cluster's own.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path


def find_mpiexec(explicit: str | None = None) -> str:
    for candidate in (explicit, os.environ.get("MPIEXEC"), str(Path(sys.executable).parent / "mpiexec"),
                      shutil.which("mpiexec"), shutil.which("mpirun")):
        if candidate and (Path(candidate).is_file() or shutil.which(candidate)):
            return candidate
    raise SystemExit("mpi_launch: no mpiexec found; install the `mpich` wheel (pip install mpich), "
                     "put your MPI's mpiexec on PATH, or pass --mpiexec")


def parse(argv=None):
    p = argparse.ArgumentParser(prog="mpi_launch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--nproc_per_node", type=int, default=1)
    p.add_argument("--node_rank", type=int, default=0,
                   help="accepted for torchrun compatibility; mpiexec places ranks on nodes itself")
    p.add_argument("--rdzv_endpoint", default="127.0.0.1:29500", help="host:port -> MASTER_ADDR/PORT")
    p.add_argument("--hostfile", default=None, help="one host per line (needed for --nnodes > 1)")
    p.add_argument("--mpiexec", default=None)
    p.add_argument("--max_restarts", type=int, default=0,
                   help="start the whole job again after a failure, up to this many times")
    p.add_argument("-m", dest="module", default=None, help="run a module, as python -m")
    p.add_argument("script", nargs="?", help="the training script (or use -m)")
    argv = list(sys.argv[1:] if argv is None else argv)
    # as torchrun: everything after the script or `-m MODULE` belongs to the program, whatever
    # it looks like (argparse alone would claim the program's --flags as the launcher's)
    at, target = 0, None
    while at < len(argv):
        tok = argv[at]
        if tok == "-m" and at + 1 < len(argv):
            target, rest = argv[at:at + 2], argv[at + 2:]
            break
        if not tok.startswith("-"):
            target, rest = [tok], argv[at + 1:]
            break
        at += 1 if "=" in tok or tok in ("-h", "--help") else 2  # launcher flags all take a value
    if target is None:
        p.parse_args(argv)  # --help, or an error naming what is wrong
        p.error("give a script or -m module")
    a = p.parse_args(argv[:at] + target)
    a.args = rest
    if a.nnodes < 1 or a.nproc_per_node < 1:
        p.error("--nnodes and --nproc_per_node must be >= 1")
    if a.max_restarts < 0:
        p.error("--max_restarts must be >= 0")
    if a.nnodes > 1 and not a.hostfile:
        p.error("--nnodes > 1 needs --hostfile naming the nodes")
    return a


def command(a, env: dict | None = None) -> list:
    """The mpiexec command line; env: more variables every rank gets."""
    world = a.nnodes * a.nproc_per_node
    host, _, port = a.rdzv_endpoint.rpartition(":")
    cmd = [find_mpiexec(a.mpiexec), "-n", str(world)]
    if a.hostfile:
        cmd += ["-f", a.hostfile, "-ppn", str(a.nproc_per_node)]
    cmd += ["-prepend-rank",
            "-genv", "MASTER_ADDR", host or "127.0.0.1", "-genv", "MASTER_PORT", port or "29500",
            "-genv", "WORLD_SIZE", str(world), "-genv", "LOCAL_WORLD_SIZE", str(a.nproc_per_node)]
    if "OMP_NUM_THREADS" not in os.environ:
        cmd += ["-genv", "OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // a.nproc_per_node))]
    for k, v in (env or {}).items():
        cmd += ["-genv", k, v]
    target = ["-m", a.module] if a.module else [a.script]
    return cmd + [sys.executable, "-m", "mpi_launch.worker"] + target + list(a.args)


def _run(cmd, env) -> tuple:
    """Runs the job with its output passed through; (exit code, its last lines of output)."""
    import collections
    import threading
    tail = collections.deque(maxlen=40)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace")

    def copy(src, dst):
        for line in src:
            dst.write(line)
            dst.flush()
            tail.append(line.rstrip("\n"))
    readers = [threading.Thread(target=copy, args=pair, daemon=True)
               for pair in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))]
    for r in readers:
        r.start()
    code = proc.wait()
    for r in readers:
        r.join(timeout=5)
    return code, list(tail)


def _reason(tail: list, code: int) -> str:
    """What ended a failed job, from its last lines: a Python exception, or the launcher's
    account of a process that died (a signal)."""
    for keys in (("Error:", "Exception:"), ("EXIT STRING", "signal", "Killed")):
        for line in reversed(tail):
            if any(k in line for k in keys):
                return line.strip(" =")
    return f"exit code {code}"


def main(argv=None) -> int:
    a = parse(argv)
    try:
        for attempt in range(a.max_restarts + 1):
            restart = {"TORCHELASTIC_RESTART_COUNT": str(attempt), "TORCHELASTIC_MAX_RESTARTS": str(a.max_restarts)}
            code, tail = _run(command(a, restart), dict(os.environ, **restart))
            if code == 0:
                return 0
            reason = _reason(tail, code)
            if attempt < a.max_restarts:
                print(f"mpi_launch: the job failed (exit code {code}: {reason.strip()}); restart "
                      f"{attempt + 1} of {a.max_restarts}", file=sys.stderr, flush=True)
        if a.max_restarts:
            print(f"mpi_launch: the job failed {a.max_restarts + 1} times, giving up; the last failure: "
                  f"{reason.strip()} (exit code {code})", file=sys.stderr, flush=True)
        return code
    except KeyboardInterrupt:
        return 130
