"""Runs on every rank under mpi_launch: sets torchrun's per-rank variables from the MPI
launcher's own, then runs the script or module in this process."""
from __future__ import annotations

import os
import runpy
import sys

# Per-rank variables of the MPI launchers we know (MPICH/Hydra, Open MPI, MVAPICH, Slurm).
RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")
LOCAL_VARS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")


def _first(names, default=None):
    for n in names:
        if n in os.environ:
            return os.environ[n]
    return default


def main() -> None:
    # whole lines, as they are printed, so that the launcher's rank prefixes stay readable
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, write_through=False)
    rank = _first(RANK_VARS, "0")
    os.environ.setdefault("RANK", rank)
    local = _first(LOCAL_VARS)
    if local is None:  # derive it from the rank when the launcher does not say
        local = str(int(rank) % int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    os.environ.setdefault("LOCAL_RANK", local)
    args = sys.argv[1:]
    if not args:
        raise SystemExit("mpi_launch.worker: nothing to run")
    if args[0] == "-m":
        sys.argv = [args[1]] + args[2:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
