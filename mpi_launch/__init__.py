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
another, such as a cluster's own. The launcher's kind is read from its --version (MPICH/Intel
Hydra, Open MPI, Slurm's srun; --launcher overrides) and the flags are written in its
language; --launcher_args passes more flags to it as they are.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path


def find_mpiexec(explicit: str | None = None) -> str:
    for name, given in (("--mpiexec", explicit), ("$MPIEXEC", os.environ.get("MPIEXEC"))):
        if given:  # asked for by name: that one or an error, never a silent substitute
            if Path(given).is_file() or shutil.which(given):
                return given
            raise SystemExit(f"mpi_launch: {name} {given}: no such program")
    for candidate in (str(Path(sys.executable).parent / "mpiexec"), shutil.which("mpiexec"), shutil.which("mpirun")):
        if candidate and (Path(candidate).is_file() or shutil.which(candidate)):
            return candidate
    raise SystemExit("mpi_launch: no mpiexec found; install the `mpich` wheel (pip install mpich), "
                     "put your MPI's mpiexec on PATH, or pass --mpiexec")


LAUNCHERS = ("hydra", "openmpi", "srun")
DEFAULT_ENDPOINT = "127.0.0.1:29500"


def launcher_kind(mpiexec: str) -> str:
    """hydra (MPICH, Intel MPI), openmpi or srun, from the launcher's name and --version."""
    if Path(mpiexec).name == "srun":
        return "srun"
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
        text = out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SystemExit(f"mpi_launch: cannot run {mpiexec} --version ({e}); pass --launcher "
                         f"{'|'.join(LAUNCHERS)}") from None
    if "Open MPI" in text or "OpenRTE" in text:
        return "openmpi"
    if "HYDRA" in text or "Hydra" in text or "Intel(R) MPI" in text:  # (Hydra lists slurm among its kernels)
        return "hydra"
    if text.lower().startswith("slurm"):
        return "srun"
    raise SystemExit(f"mpi_launch: {mpiexec} --version does not say which MPI launcher it is "
                     f"({text.strip()[:200]!r}); pass --launcher {'|'.join(LAUNCHERS)}")


def _cpus() -> int:
    """The cores this process may use (its allocation), not the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def parse(argv=None):
    p = argparse.ArgumentParser(prog="mpi_launch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--nproc_per_node", type=int, default=1)
    p.add_argument("--node_rank", type=int, default=0,
                   help="accepted for torchrun compatibility; mpiexec places ranks on nodes itself")
    p.add_argument("--rdzv_endpoint", default=DEFAULT_ENDPOINT,
                   help="host:port -> MASTER_ADDR/PORT (default: the hostfile's first host, port 29500)")
    p.add_argument("--hostfile", default=None, help="one host per line (needed for --nnodes > 1)")
    p.add_argument("--mpiexec", default=None)
    p.add_argument("--launcher", default=None, choices=LAUNCHERS,
                   help="the launcher's kind (default: read from its --version)")
    p.add_argument("--launcher_args", default="",
                   help="more flags for the launcher, as one string, e.g. '--bind-to core' or '-bootstrap ssh'")
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
    if a.nnodes > 1 and not a.hostfile and a.launcher != "srun" and Path(a.mpiexec or "").name != "srun":
        p.error("--nnodes > 1 needs --hostfile naming the nodes (or srun in an allocation)")
    if a.hostfile and not Path(a.hostfile).is_file():
        p.error(f"--hostfile {a.hostfile}: no such file")
    return a


def command(a, env: dict | None = None, kind: str | None = None) -> list:
    """The launcher's command line (kind: hydra, openmpi or srun); env: more variables every
    rank gets."""
    import shlex
    world = a.nnodes * a.nproc_per_node
    host, _, port = a.rdzv_endpoint.rpartition(":")
    if a.hostfile and a.rdzv_endpoint == DEFAULT_ENDPOINT:  # the first node, as torchrun's default
        hosts = [ln.split()[0].split(":")[0] for ln in Path(a.hostfile).read_text().splitlines()
                 if ln.strip() and not ln.lstrip().startswith("#")]
        host = hosts[0] if hosts else host
    exe = find_mpiexec(a.mpiexec)
    kind = kind or a.launcher or launcher_kind(exe)
    variables = {"MASTER_ADDR": host or "127.0.0.1", "MASTER_PORT": port or "29500",
                 "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(a.nproc_per_node)}
    if "OMP_NUM_THREADS" not in os.environ:
        variables["OMP_NUM_THREADS"] = str(max(1, _cpus() // a.nproc_per_node))
    variables.update(env or {})
    if kind == "hydra":
        cmd = [exe, "-n", str(world)]
        if a.hostfile:
            cmd += ["-f", a.hostfile, "-ppn", str(a.nproc_per_node)]
        cmd += ["-prepend-rank"]
        for k, v in variables.items():
            cmd += ["-genv", k, v]
    elif kind == "openmpi":
        cmd = [exe, "-n", str(world), "--tag-output"]
        if a.hostfile:
            cmd += ["--hostfile", a.hostfile, "--map-by", f"ppr:{a.nproc_per_node}:node"]
        if a.nproc_per_node > _cpus() and not a.hostfile:  # more ranks than cores here, as Hydra allows
            cmd += ["--oversubscribe"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:  # Open MPI refuses root unless told
            cmd += ["--allow-run-as-root"]
        for k, v in variables.items():
            cmd += ["-x", f"{k}={v}"]
    else:  # srun: inside an allocation, its nodes
        cmd = [exe, "-n", str(world), "--ntasks-per-node", str(a.nproc_per_node), "--label",
               "--export=" + ",".join(["ALL"] + [f"{k}={v}" for k, v in variables.items()])]
        if a.nnodes > 1:
            cmd += ["-N", str(a.nnodes)]
    cmd += shlex.split(a.launcher_args)
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
    kind = a.launcher or launcher_kind(find_mpiexec(a.mpiexec))
    try:
        for attempt in range(a.max_restarts + 1):
            restart = {"TORCHELASTIC_RESTART_COUNT": str(attempt), "TORCHELASTIC_MAX_RESTARTS": str(a.max_restarts)}
            code, tail = _run(command(a, restart, kind), dict(os.environ, **restart))
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
