"""mpi_launch: torchrun-style flags on top of mpiexec.

    mpi_launch --nproc_per_node 4 -m infinitrain.examples.gpt2 --model small
    mpi_launch --nnodes 2 --nproc_per_node 8 --hostfile hosts train.py ...

Each rank gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) and OMP_NUM_THREADS = cores / local ranks unless it is set; output
lines are prefixed with the rank; the exit code is the job's (non-zero if any rank failed).
With --max_restarts N a failed job is started again, whole, up to N times (torchrun's flag):
each run gets TORCHELASTIC_RESTART_COUNT (0 first) and TORCHELASTIC_MAX_RESTARTS, and the
examples then resume from their --save folder's latest checkpoint by themselves.
mpiexec is the one next to this Python (the `mpich` extra's) unless --mpiexec or $MPIEXEC names
another, such as a cluster's own; else the first mpiexec/mpirun on PATH. The launcher's kind is
read from its --version (MPICH/Intel Hydra, Open MPI, Slurm's srun; --launcher overrides) and
the flags are written in its language; --launcher_args passes more flags to it as they are.
Inside a Slurm allocation (sbatch, salloc) --nnodes and --nproc_per_node default to the
allocation's nodes and tasks per node, and MASTER_ADDR to its first node.
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
    raise SystemExit("mpi_launch: no mpiexec found: put your MPI's mpiexec/mpirun on PATH (`module load` "
                     "it), pass --mpiexec, or install the MPICH runtime from PyPI: pip install 'infinitrain[mpich]'")


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


def start(n: int, mpiexec: str | None = None, kind: str | None = None, one_node: bool = True) -> list:
    """The head of a command that starts n ranks (on this node unless one_node is False):
    `mpiexec -n N`, plus what Open MPI needs to do what Hydra does unasked: whole lines (its
    untagged output can split a rank's line where another rank's lands), more ranks than this
    node's cores, running as root."""
    exe = find_mpiexec(mpiexec)
    kind = kind or launcher_kind(exe)
    cmd = [exe, "-n", str(n)]
    if kind == "openmpi":
        cmd += ["--tag-output"]
        if one_node and n > _cpus():
            cmd += ["--oversubscribe"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:  # Open MPI refuses root unless told
            cmd += ["--allow-run-as-root"]
    return cmd


def slurm_allocation() -> dict | None:
    """The Slurm allocation this process runs in (sbatch, salloc), or None: its nodes (names,
    in order) and tasks per node."""
    if "SLURM_JOB_ID" not in os.environ:
        return None
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", "")
    hosts = []
    if nodelist:
        try:
            out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                                 text=True, timeout=30)
            hosts = out.stdout.split() if out.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired):
            pass
        hosts = hosts or ([nodelist] if "[" not in nodelist and "," not in nodelist else [])
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or len(hosts) or 1)
    per_node = os.environ.get("SLURM_NTASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE", "")
    per_node = per_node.split("(")[0].split(",")[0]  # "4(x2),3": the first node's count
    if not per_node.isdigit():
        ntasks = os.environ.get("SLURM_NTASKS", "")
        per_node = str(max(1, int(ntasks) // nodes)) if ntasks.isdigit() else "1"
    return {"hosts": hosts, "nodes": nodes, "tasks_per_node": int(per_node)}


def srun_mpi_plugin() -> str:
    """srun's --mpi for the MPI that mpi4py loads here: pmix for Open MPI, pmi2 for MPICH and
    Intel MPI (read in a child process, so that this launcher holds no MPI state)."""
    probe = ("import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
             "print(MPI.Get_library_version())")
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "pmix"
    return "pmix" if "Open MPI" in out.stdout else "pmi2"


def parse(argv=None):
    p = argparse.ArgumentParser(prog="mpi_launch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nnodes", type=int, default=None,
                   help="nodes (default: the Slurm allocation's, else 1)")
    p.add_argument("--nproc_per_node", type=int, default=None,
                   help="ranks per node (default: the Slurm allocation's tasks per node, else 1)")
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
    a.allocation = slurm_allocation()
    if a.nnodes is None:
        a.nnodes = a.allocation["nodes"] if a.allocation else 1
    if a.nproc_per_node is None:
        a.nproc_per_node = a.allocation["tasks_per_node"] if a.allocation else 1
    if a.nnodes < 1 or a.nproc_per_node < 1:
        p.error("--nnodes and --nproc_per_node must be >= 1")
    if a.max_restarts < 0:
        p.error("--max_restarts must be >= 0")
    if a.nnodes > 1 and not a.hostfile and not a.allocation:
        p.error("--nnodes > 1 needs --hostfile naming the nodes (or a Slurm allocation: sbatch, salloc)")
    if a.hostfile and not Path(a.hostfile).is_file():
        p.error(f"--hostfile {a.hostfile}: no such file")
    return a


def _first_host(a) -> str | None:
    """torchrun's default rendezvous host: the hostfile's first node, else the allocation's."""
    if a.hostfile:
        hosts = [ln.split()[0].split(":")[0] for ln in Path(a.hostfile).read_text().splitlines()
                 if ln.strip() and not ln.lstrip().startswith("#")]
        return hosts[0] if hosts else None
    if a.allocation and a.allocation["hosts"]:
        return a.allocation["hosts"][0]
    return None


def command(a, env: dict | None = None, kind: str | None = None) -> list:
    """The launcher's command line (kind: hydra, openmpi or srun); env: more variables every
    rank gets."""
    import shlex
    world = a.nnodes * a.nproc_per_node
    host, _, port = a.rdzv_endpoint.rpartition(":")
    if a.rdzv_endpoint == DEFAULT_ENDPOINT:
        host = _first_host(a) or host
    exe = find_mpiexec(a.mpiexec)
    kind = kind or a.launcher or launcher_kind(exe)
    variables = {"MASTER_ADDR": host or "127.0.0.1", "MASTER_PORT": port or "29500",
                 "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(a.nproc_per_node)}
    if "OMP_NUM_THREADS" not in os.environ:
        variables["OMP_NUM_THREADS"] = str(max(1, _cpus() // a.nproc_per_node))
    variables.update(env or {})
    nodes = a.hostfile or a.nnodes > 1  # place N ranks per node (else all on this one)
    if kind == "hydra":
        cmd = start(world, exe, kind)
        if a.hostfile:
            cmd += ["-f", a.hostfile]
        if nodes:
            cmd += ["-ppn", str(a.nproc_per_node)]
        cmd += ["-prepend-rank"]
        for k, v in variables.items():
            cmd += ["-genv", k, v]
    elif kind == "openmpi":
        cmd = start(world, exe, kind, one_node=not nodes)
        if a.hostfile:
            cmd += ["--hostfile", a.hostfile]
        if nodes:
            cmd += ["--map-by", f"ppr:{a.nproc_per_node}:node"]
        for k, v in variables.items():
            cmd += ["-x", f"{k}={v}"]
    else:  # srun: inside an allocation, its nodes
        cmd = [exe, "-n", str(world), "--ntasks-per-node", str(a.nproc_per_node), "--label",
               "--export=" + ",".join(["ALL"] + [f"{k}={v}" for k, v in variables.items()])]
        if a.nnodes > 1:
            cmd += ["-N", str(a.nnodes)]
        if "--mpi" not in a.launcher_args and "SLURM_MPI_TYPE" not in os.environ:
            cmd += [f"--mpi={srun_mpi_plugin()}"]  # Slurm's MpiDefault is none: no MPI world
    cmd += shlex.split(a.launcher_args)
    target = ["-m", a.module] if a.module else [a.script]
    return cmd + [sys.executable, "-m", "mpi_launch.worker"] + target + list(a.args)


def launcher_env(kind: str, env: dict) -> dict:
    """The launcher's own environment. Hydra inside a Slurm allocation starts its proxies with
    srun; with the cluster's MpiDefault=pmix those would carry PMIx variables next to Hydra's
    PMI ones, which MPICH refuses: its srun gets --mpi=none."""
    if kind == "hydra" and "SLURM_JOB_ID" in env:
        return dict(env, SLURM_MPI_TYPE="none")
    return env


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
            code, tail = _run(command(a, restart, kind), launcher_env(kind, dict(os.environ, **restart)))
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
