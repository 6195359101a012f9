"""File helpers shared by the readers and writers (llm.c files, checkpoints): atomic writes,
checksums, and the error for a file that is not what it claims to be."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


class DataFormatError(ValueError):
    """A file that is not what it claims: names the file and the problem."""


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
