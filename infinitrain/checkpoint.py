"""Training checkpoints: everything needed to resume a run exactly, in files that cannot
execute code (safetensors for tensors, JSON for the rest).

Layout of a checkpoint root DIR:

    DIR/step_000005/model.safetensors      parameters and persistent buffers
    DIR/step_000005/optimizer.safetensors  per-parameter optimizer tensors, keys "<index>.<name>"
    DIR/step_000005/meta.json              {"format": "infinitrain-checkpoint", "version": 1,
                                            "step", "optimizer": scalars and hyperparameters,
                                            "rng": [seed, offset], "extra": {...}, "dtypes": {...},
                                            "sha256": {file: digest}}
    DIR/latest                             the name of the newest complete checkpoint

A checkpoint is written into a temporary folder, synced, and renamed into place; `latest` is
replaced the same way afterwards. A save that is killed part-way leaves the previous checkpoint
as `latest`. Loading checks the format version, every file's checksum, and the model's names and
shapes, and says exactly what does not match.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from .autograd import no_grad
from .io import fsync_dir, sha256_file
from .creation import from_numpy
from .random import default_generator
from .tensor import Tensor

FORMAT = "infinitrain-checkpoint"
VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, damaged, from another format version, or does not fit."""


def _to_numpy(t: Tensor) -> tuple:
    """(array safetensors can store, dtype name to restore)."""
    a = np.ascontiguousarray(t.detach().numpy())
    if t.dtype.name == "bfloat16":
        return a.view(np.uint16), "bfloat16"
    return a, t.dtype.name


def _from_numpy(a: np.ndarray, dtype_name: str) -> Tensor:
    if dtype_name == "bfloat16":
        import ml_dtypes
        a = a.view(ml_dtypes.bfloat16)
    return from_numpy(np.ascontiguousarray(a))


def _full(p: Tensor) -> Tensor:
    """The one-process tensor of a parameter (a tensor-parallel shard is gathered)."""
    shard = getattr(p, "tp_shard", None)
    return shard.gather(p) if shard is not None else p


def _param_list(optimizer) -> list:
    return [p for g in optimizer.param_groups for p in g["params"]]


def save_checkpoint(root, step: int, model, optimizer=None, extra: dict | None = None,
                    keep: int | None = None, write: bool = True) -> Path:
    """Writes DIR/step_<step>/ atomically and points DIR/latest at it; with `keep`, only the
    newest `keep` checkpoints are kept. The files hold the one-process tensors whatever the
    layout: under tensor parallelism every rank calls this (shards are gathered over their
    group) and the one with write=True writes."""
    from safetensors.numpy import save_file
    model_tensors = {k: _full(t) for k, t in model.state_dict(keep_vars=True).items()}
    opt_sd = None
    if optimizer is not None:
        opt_sd = optimizer.state_dict()
        params = _param_list(optimizer)
        for idx, st in opt_sd["state"].items():
            shard = getattr(params[int(idx)], "tp_shard", None)
            for k, v in st.items():
                if shard is not None and isinstance(v, Tensor) and tuple(v.shape) == tuple(params[int(idx)].shape):
                    st[k] = shard.gather(v)
    if not write:
        return Path(root) / f"step_{step:06d}"
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    tmp = root / f".{name}.tmp{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    dtypes = {}
    tensors = {}
    for k, t in model_tensors.items():
        tensors[k], dtypes[f"model/{k}"] = _to_numpy(t)
    save_file(tensors, str(tmp / "model.safetensors"))
    meta = {"format": FORMAT, "version": VERSION, "step": int(step),
            "rng": list(default_generator.get_state()), "extra": extra or {}}
    if optimizer is not None:
        sd = opt_sd
        opt_tensors, scalars = {}, {}
        for idx, st in sd["state"].items():
            for k, v in st.items():
                if isinstance(v, Tensor):
                    opt_tensors[f"{idx}.{k}"], dtypes[f"optimizer/{idx}.{k}"] = _to_numpy(v)
                else:
                    scalars.setdefault(str(idx), {})[k] = v
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        meta["optimizer"] = {"type": type(optimizer).__name__, "scalars": scalars,
                             "param_groups": sd["param_groups"]}
    meta["dtypes"] = dtypes
    meta["sha256"] = {f.name: sha256_file(f) for f in sorted(tmp.iterdir())}
    with open(tmp / "meta.json", "w") as f:
        json.dump(meta, f, indent=1, default=_json_default)
        f.flush()
        os.fsync(f.fileno())
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = root / f".latest.tmp{os.getpid()}"
    latest_tmp.write_text(name + "\n")
    os.replace(latest_tmp, root / "latest")
    fsync_dir(root)
    if keep:
        done = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_"))
        for old in done[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


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
        if not (path / name / "meta.json").is_file():
            raise CheckpointError(f"{path}/latest names {name}, which is missing or incomplete")
        return path / name
    raise CheckpointError(f"{path} holds no checkpoint (no meta.json and no 'latest' file)")


def load_checkpoint(path, model, optimizer=None) -> dict:
    """Loads a checkpoint into model (and optimizer), restores the RNG, and returns its meta
    ({"step", "extra", ...}). Raises CheckpointError naming any mismatch."""
    from safetensors.numpy import load_file
    folder = resolve(path)
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{folder}/meta.json is not valid JSON ({e})") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{folder} is not an infinitrain checkpoint (format {meta.get('format')!r})")
    if meta.get("version") != VERSION:
        raise CheckpointError(f"{folder} has checkpoint format version {meta.get('version')}; this "
                              f"infinitrain reads version {VERSION}")
    for name, digest in meta["sha256"].items():
        f = folder / name
        if not f.is_file():
            raise CheckpointError(f"{f} is missing")
        if sha256_file(f) != digest:
            raise CheckpointError(f"{f} is damaged: its sha256 does not match the one recorded "
                                  "when it was saved")
    dtypes = meta.get("dtypes", {})
    arrays = load_file(str(folder / "model.safetensors"))
    state = {k: _from_numpy(a, dtypes.get(f"model/{k}", "")) for k, a in arrays.items()}
    own = model.state_dict(keep_vars=True)
    for k, t in own.items():  # a tensor-parallel shard takes its slice of the full tensor
        shard = getattr(t, "tp_shard", None)
        if shard is not None and k in state:
            want = shard.full_shape(t.shape)
            if tuple(state[k].shape) != want:
                raise CheckpointError(f"{folder} does not fit this model: {k}: checkpoint "
                                      f"{tuple(state[k].shape)} vs model {want}")
            state[k] = shard.take(state[k])
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{folder} does not fit this model: {e}") from None
    if optimizer is not None:
        if "optimizer" not in meta:
            raise CheckpointError(f"{folder} holds no optimizer state")
        o = meta["optimizer"]
        if o["type"] != type(optimizer).__name__:
            raise CheckpointError(f"{folder} holds {o['type']} state, not {type(optimizer).__name__}")
        tensors = load_file(str(folder / "optimizer.safetensors"))
        st = {}
        for key, a in tensors.items():
            idx, name = key.split(".", 1)
            st.setdefault(int(idx), {})[name] = _from_numpy(a, dtypes.get(f"optimizer/{key}", ""))
        for idx, scalars in o["scalars"].items():
            st.setdefault(int(idx), {}).update(scalars)
        params = _param_list(optimizer)
        for idx, entries in st.items():
            shard = getattr(params[idx], "tp_shard", None) if 0 <= idx < len(params) else None
            if shard is None:
                continue
            want = shard.full_shape(params[idx].shape)
            for k, v in entries.items():
                if isinstance(v, Tensor) and tuple(v.shape) == want:
                    entries[k] = shard.take(v)
        groups = [dict(g, betas=tuple(g["betas"])) if "betas" in g else g for g in o["param_groups"]]
        try:
            optimizer.load_state_dict({"state": st, "param_groups": groups})
        except ValueError as e:
            raise CheckpointError(f"{folder}: optimizer state does not fit: {e}") from None
    default_generator.set_state(meta["rng"])
    return meta


@no_grad()
def save_pretrained(model, folder) -> None:
    """Weights as model.safetensors plus config.json, the layout the ecosystem reads."""
    from dataclasses import asdict
    from safetensors.numpy import save_file
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: np.ascontiguousarray(v.float().numpy()) for k, v in model.state_dict().items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "np"})
    cfg = {"model_type": type(model).__name__, **asdict(model.config)}
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))


def from_pretrained(cls, folder):
    """The model class's inverse of save_pretrained."""
    from safetensors.numpy import load_file
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    kind = cfg.pop("model_type", cls.__name__)
    if kind != cls.__name__:
        raise CheckpointError(f"{folder} holds a {kind}, not a {cls.__name__}")
    model = cls(cls.config_class(**cfg), seed=0)
    state = {k: from_numpy(np.ascontiguousarray(a)) for k, a in load_file(str(folder / "model.safetensors")).items()}
    model.load_state_dict(state, strict=True)
    return model
