"""The on-disk format of a training checkpoint, and nothing that depends on a model or its
layout: the folder's layout and meta.json's fields, the format version, CheckpointError, how a
tensor becomes a safetensors array and back (bfloat16 included), how a tensor file is written
and synced, meta.json's own checksum and its field-by-field check, and how a path names a
checkpoint (`resolve`, `read_meta`). The writer and the loader both go through these, so a
change of format is a change here; it imports nothing else from infinitrain.checkpoint.

Layout of a checkpoint root DIR:

    DIR/step_000005/model.safetensors      parameters and persistent buffers
    DIR/step_000005/optimizer.safetensors  optimizer tensors, keys "<parameter name>/<state name>"
    DIR/step_000005/meta.json              {"format": "infinitrain-checkpoint", "version": 2,
                                            "step", "optimizer": scalars and hyperparameters,
                                            "rng": [seed, offset], "extra": {...}, "dtypes": {...},
                                            "sha256": {file: digest},
                                            "meta_sha256": the digest of the rest of meta.json}
    DIR/latest                             the name of the newest complete checkpoint

Under pipeline parallelism each stage writes its own layers, as model-stage-S-of-P.safetensors
and optimizer-stage-S-of-P.safetensors. Loading checks the format version, every file's
checksum (sharded.load_checkpoint) and every field of meta.json (here), and says exactly what
does not match.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from ..creation import from_numpy
from ..tensor import Tensor

FORMAT = "infinitrain-checkpoint"
VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: optimizer tensors keyed by parameter index (one layout only)


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, damaged, from another format version, or does not fit."""


def ensure_writable(root) -> None:
    """Raises CheckpointError unless checkpoints can be written under root (created if need
    be): a training script calls it before training, not after hours of it."""
    root = Path(root)
    probe = root / f".probe.{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise CheckpointError(f"cannot write checkpoints to {root}: {e.strerror or e}") from None


def _to_numpy(t: Tensor) -> tuple:
    """(array safetensors can store, dtype name to restore)."""
    a = np.ascontiguousarray(t.detach().cpu().numpy())
    if t.dtype.name == "bfloat16":
        return a.view(np.uint16), "bfloat16"
    return a, t.dtype.name


def _from_numpy(a: np.ndarray, dtype_name: str) -> Tensor:
    if dtype_name == "bfloat16":
        import ml_dtypes
        a = a.view(ml_dtypes.bfloat16)
    return from_numpy(np.ascontiguousarray(a))


def _umask() -> int:
    """The process's umask, read without setting it (os.umask sets it, which would race with the
    asynchronous writer's thread): /proc/self/status on Linux, else 0o022."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return 0o022


def _write_safetensors(save_file, arrays: dict, path: Path, metadata: dict | None = None) -> None:
    """A safetensors file, synced, with the permissions open() would give it (safetensors writes
    its files owner-only, 0600, whatever the umask: a team's shared storage could not read
    them)."""
    save_file(arrays, str(path), metadata=metadata)
    os.chmod(path, 0o666 & ~_umask())
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _json_default(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, tuple):
        return list(v)
    raise TypeError(f"cannot store {type(v).__name__} in a checkpoint's meta.json")


def resolve(path) -> Path:
    """A checkpoint folder from either itself or a root holding `latest`."""
    path = Path(path)
    if (path / "meta.json").is_file():
        return path
    if (path / "latest").is_file():
        name = (path / "latest").read_text().strip()
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name) or name.startswith(".."):
            raise CheckpointError(f"{path}/latest names {name[:80]!r}, which is not a checkpoint folder "
                                  f"inside {path} (a name such as step_000010)")
        if not (path / name / "meta.json").is_file():
            raise CheckpointError(f"{path}/latest names {name}, which is missing or incomplete")
        return path / name
    raise CheckpointError(f"{path} holds no checkpoint (no meta.json and no 'latest' file)")


def read_meta(path) -> dict:
    """The meta.json of a checkpoint (or of a root's latest one), checked, without its tensors."""
    return _read_meta(resolve(path))


_DTYPES = ("float32", "float64", "bfloat16", "float16", "int32", "int64", "uint8", "bool")


def _meta_digest(meta: dict) -> str:
    """The checksum of meta.json's own content (all of it but this field)."""
    import hashlib
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _read_meta(folder: Path) -> dict:
    """meta.json, checked field by field: whatever it holds, a CheckpointError naming the
    problem, never a KeyError from deep inside loading."""
    where = folder / "meta.json"
    try:
        meta = json.loads(where.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise CheckpointError(f"{where} is not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None

    def bad(what: str):
        return CheckpointError(f"{where}: {what}")

    if not isinstance(meta, dict):
        raise bad("is not a JSON object")
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{folder} is not an infinitrain checkpoint (format {meta.get('format')!r})")
    if meta.get("version") not in READABLE_VERSIONS:
        raise CheckpointError(f"{folder} has checkpoint format version {meta.get('version')}; this "
                              f"infinitrain reads versions {', '.join(map(str, READABLE_VERSIONS))}")
    if meta["version"] >= 2 and meta.get("meta_sha256") != _meta_digest(meta):
        raise bad("has been changed since it was saved (its own checksum does not match)")
    step = meta.get("step")
    if type(step) is not int or not 0 <= step < 2**62:
        raise bad(f"'step' must be a non-negative integer, got {step!r}")
    rng = meta.get("rng")
    if not (isinstance(rng, list) and len(rng) == 2 and all(type(v) is int and 0 <= v < 2**64 for v in rng)):
        raise bad(f"'rng' must be [seed, offset] (two non-negative integers), got {str(rng)[:80]}")
    if not isinstance(meta.get("extra", {}), dict):
        raise bad("'extra' must be an object")
    dtypes = meta.get("dtypes", {})
    if not isinstance(dtypes, dict) or any(not isinstance(v, str) or v not in _DTYPES for v in dtypes.values()):
        raise bad(f"'dtypes' must map tensor names to one of {', '.join(_DTYPES)}")
    digests = meta.get("sha256")
    if not isinstance(digests, dict) or not digests:
        raise bad("'sha256' must list every file of the checkpoint with its digest")
    for name, digest in digests.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+\.safetensors", name) \
                or name.startswith("."):
            raise bad(f"names a file {name!r} that is not a safetensors file inside the checkpoint folder")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise bad(f"the sha256 of {name} is not a digest: {str(digest)[:80]!r}")
    if not any(n.startswith("model") for n in digests):
        raise bad("lists no model file")
    o = meta.get("optimizer")
    if o is not None:
        groups = o.get("param_groups") if isinstance(o, dict) else None
        if not (isinstance(o, dict) and isinstance(o.get("type"), str) and isinstance(o.get("scalars"), dict)
                and isinstance(groups, list) and all(isinstance(g, dict) for g in groups)):
            raise bad("'optimizer' must hold 'type', 'scalars' and 'param_groups'")
        if not any(n.startswith("optimizer") for n in digests):
            raise bad("has optimizer state but lists no optimizer file")
    return meta
