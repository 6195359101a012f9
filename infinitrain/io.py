"""File helpers shared by the readers and writers (llm.c files, checkpoints): atomic writes,
checksums, and the error for a file that is not what it claims to be."""
from __future__ import annotations

import hashlib
import os
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
