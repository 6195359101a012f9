"""File helpers shared by the readers and writers (llm.c files, checkpoints): atomic writes,
checksums, the error for a file that is not what it claims to be, and the progress bar shown
while a person waits on them."""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path


class DataFormatError(ValueError):
    """A file that is not what it claims: names the file and the problem."""


def input_file(path, what: str) -> Path:
    """path, if it is a regular file this process can read; else the error that says which of
    missing, a directory, not a regular file (a FIFO, socket, device) or unreadable it is."""
    import stat
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} does not exist") from None
    except OSError as e:
        raise OSError(f"{what} {path}: {e.strerror}") from None
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"{what} {path} is a directory, not a file")
    if not stat.S_ISREG(mode):
        raise DataFormatError(f"{what} {path} is not a regular file (a FIFO, socket or device)")
    if not os.access(path, os.R_OK):
        raise PermissionError(f"{what} {path} is not readable (permission denied)")
    return path


def atomic_write(path, data: bytes) -> None:
    """Writes data to path through a temporary file and a rename, so a reader never sees a
    half-written file and a killed write leaves the old one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def process_rank() -> int:
    """This process's rank: MPI's once it is up, else the launcher's variables (before init:
    the flags are checked first). SLURM_PROCID only inside an srun step: every rank of an
    mpirun inside an allocation inherits the batch script's 0."""
    if "mpi4py.MPI" in sys.modules:  # (importing it would start MPI: not before parallel.init has)
        MPI = sys.modules["mpi4py.MPI"]
        if MPI.Is_initialized() and not MPI.Is_finalized():
            return MPI.COMM_WORLD.Get_rank()
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    if os.environ.get("SLURM_STEP_NUM_TASKS") and os.environ.get("SLURM_PROCID", "").isdigit():
        return int(os.environ["SLURM_PROCID"])
    return 0


def shows_progress() -> bool:
    """Whether a person watches this process: rank 0 with stderr on a terminal (not a log file,
    a pipe or CI)."""
    return process_rank() == 0 and sys.stderr.isatty()


def progress(iterable, total: int | None = None, desc: str | None = None, unit: str = "it"):
    """iterable with a tqdm progress bar on stderr where a person watches it (shows_progress).
    Elsewhere (a log file, a pipe, CI, the other ranks) the iterable itself, so that logs hold
    only their lines. The bar is drawn below the log lines and removed when done."""
    if total == 0 or not shows_progress():  # (nothing to wait for: no empty bar either)
        return iterable
    from tqdm import tqdm
    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=False, file=sys.stderr, dynamic_ncols=True)
