"""Training checkpoints: everything needed to resume a run exactly, in files that cannot
execute code (safetensors for tensors, JSON for the rest), holding the one-process tensors
under their one-process names whatever the layout that wrote them, and loadable under any
other layout.

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
and optimizer-stage-S-of-P.safetensors; tensor-parallel shards are gathered first, so every
tensor is whole and written once. Loading reads, from whichever files hold them, just the
tensors this rank's part of the model needs and cuts its shard out of each.

A checkpoint is written into a temporary folder, synced, and renamed into place; `latest` is
replaced the same way afterwards. A save that is killed part-way leaves the previous checkpoint
as `latest`. Loading checks the format version, every file's checksum, and the model's names and
shapes, and says exactly what does not match.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from .autograd import no_grad
from safetensors import SafetensorError

from .io import DataFormatError, atomic_write, fsync_dir, input_file, sha256_file
from .creation import from_numpy
from .random import default_generator
from .tensor import Tensor
from .nn.parallel.tensor_parallel import full_tensor, load_full

FORMAT = "infinitrain-checkpoint"
VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: optimizer tensors keyed by parameter index (one layout only)


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, damaged, from another format version, or does not fit."""


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


def _gathered(optimizer, write: bool = False):
    """An optimizer that holds the model's parameters sharded (ZeRO-3) makes them whole for
    the time a checkpoint reads or writes them."""
    gathered = getattr(optimizer, "gathered_parameters", None)
    return gathered(write) if gathered is not None else nullcontext()


def _param_list(optimizer) -> list:
    return [p for g in optimizer.param_groups for p in g["params"]]


def _param_names(model) -> dict:
    """id(parameter) -> its one-process name (a pipeline stage's copy of a tied parameter is
    named after the original, whose optimizer state it shares)."""
    return {id(p): getattr(p, "tied_copy_of", None) or n for n, p in model.named_parameters()}


def _stored_names(model) -> dict:
    """state-dict key -> the name it is stored under: its own, or that of the parameter it is
    tied to (a tied alias such as GPT-2's head, or a pipeline stage's copy of one)."""
    first, out = {}, {}
    for k, t in model.state_dict(keep_vars=True).items():
        copy_of = getattr(t, "tied_copy_of", None)
        out[k] = copy_of if copy_of is not None else first.setdefault(id(t), k)
    return out


def _stage_suffix(model) -> str:
    pp = getattr(model, "pp", None)
    return "" if pp is None else f"-stage-{pp.stage}-of-{pp.size}"


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


def save_checkpoint(root, step: int, model, optimizer=None, extra: dict | None = None,
                    keep: int | None = None, write: bool = True) -> Path:
    """Writes DIR/step_<step>/ atomically and points DIR/latest at it; with `keep`, only the
    newest `keep` checkpoints are kept. Collective over the layout: under tensor parallelism
    every rank calls it (shards are gathered over their group); `write` says whether this rank
    writes. Under pipeline parallelism exactly one rank per stage, all of one pipeline (say
    DP rank 0, TP rank 0), writes: each its stage's part, stage 0 the rest."""
    with _gathered(optimizer):  # ZeRO-3: the parameters whole while they are read and written
        snap = _snapshot(root, step, model, optimizer, extra, keep, write, copy=False)
        if snap is None:
            return Path(root) / f"step_{step:06d}"
        snap.begin()
        snap.write_files()  # the arrays are the tensors' own memory: written before it is released
    return snap.commit()


class AsyncSave:
    """A checkpoint being written in the background (save_checkpoint_async): the state was
    copied when it was made; a thread writes, checksums and syncs the files. `poll()` (every
    step) commits it once every writer's files are on disk (moves `latest`), `wait()` blocks
    until then. A failure of the writer is raised by poll()/wait() as a CheckpointError."""

    def __init__(self, snap):
        import threading
        self.snap, self.path, self.error, self.committed = snap, None, None, snap is None
        self._thread = None
        if snap is not None:
            snap.begin()  # the folder, made in order with the other writers (a collective)
            self._thread = threading.Thread(target=self._run, name="infinitrain-async-save", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self.snap.write_files()
            if self.snap.pp is None:  # the only writer: commit here, training goes on
                self.path = self.snap.commit()
        except BaseException as e:  # noqa: BLE001 - reported on the training thread
            self.error = e

    def _files_done_everywhere(self, block: bool) -> bool:
        if block:
            self._thread.join()
        done = not self._thread.is_alive()
        pp = self.snap.pp
        if pp is None:
            return done
        from .dtypes import int64
        from .creation import tensor
        from .nn.parallel.process_group import ReduceOp
        t = tensor([int(done)], dtype=int64)
        pp.group.all_reduce(t, ReduceOp.MIN)  # every stage's writer asks at the same step
        return bool(t.item())

    def poll(self, block: bool = False) -> bool:
        """True once committed; with pp, collective over the writers' pipeline."""
        if self.committed:
            return True
        if not self._files_done_everywhere(block):
            return False
        if self.error is not None:
            self.committed = True
            raise self.error if isinstance(self.error, CheckpointError) else \
                CheckpointError(f"the background save of {self.snap.final} failed: {self.error}")
        if self.snap.pp is not None:
            self.path = self.snap.commit()
        self.committed = True
        return True

    def wait(self):
        self.poll(block=True)
        return self.path


def save_checkpoint_async(root, step: int, model, optimizer=None, extra: dict | None = None,
                          keep: int | None = None, write: bool = True) -> AsyncSave:
    """save_checkpoint with the writing in the background: the same collectives now (shards
    gathered, the state copied to host memory), the same files, byte for byte, later."""
    with _gathered(optimizer):
        snap = _snapshot(root, step, model, optimizer, extra, keep, write, copy=True)
    return AsyncSave(snap)


class _Snapshot:
    """What one rank writes for one checkpoint, taken from the model and optimizer at once."""

    def __init__(self, root, name, step, pp, suffix, kind, model_arrays, opt_arrays, dtypes, scalars,
                 groups, extra, keep, has_optimizer):
        self.root, self.name, self.step, self.pp, self.suffix, self.kind = root, name, step, pp, suffix, kind
        self.model_arrays, self.opt_arrays, self.dtypes = model_arrays, opt_arrays, dtypes
        self.scalars, self.groups, self.extra, self.keep = scalars, groups, extra, keep
        self.has_optimizer = has_optimizer
        self.rng = list(default_generator.get_state())
        self.leader = pp is None or pp.stage == 0
        self.tmp, self.final = root / f".{name}.tmp", root / name

    def _failed(self, e):
        shutil.rmtree(self.tmp, ignore_errors=True)
        return CheckpointError(f"could not write checkpoint {self.final}: {getattr(e, 'strerror', None) or e} "
                               "(nothing was written; 'latest' still names the previous one)")

    def begin(self) -> None:
        try:
            if self.leader:
                self.root.mkdir(parents=True, exist_ok=True)
                if self.tmp.exists():
                    shutil.rmtree(self.tmp)
                self.tmp.mkdir()
        except OSError as e:
            raise self._failed(e) from None
        if self.pp is not None:
            self.pp.group.barrier()  # the folder exists before any stage writes into it

    def write_files(self) -> None:
        from safetensors.numpy import save_file
        try:
            _write_safetensors(save_file, self.model_arrays, self.tmp / f"model{self.suffix}.safetensors")
            if self.has_optimizer:
                _write_safetensors(save_file, self.opt_arrays, self.tmp / f"optimizer{self.suffix}.safetensors")
            (self.tmp / f"parts{self.suffix}.json").write_text(
                json.dumps({"dtypes": self.dtypes, "scalars": self.scalars}, default=_json_default))
        except (OSError, SafetensorError) as e:  # a full or read-only disk: nothing half-written left
            raise self._failed(e) from None
        except KeyboardInterrupt:  # Ctrl-C while writing: nothing half-written left either
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise

    def commit(self) -> Path:
        """After every writer's files are on disk: meta.json, the rename, `latest`."""
        if self.pp is not None:
            self.pp.group.barrier()  # every stage's files are on disk
        try:
            if self.leader:
                self._commit()
        except (OSError, SafetensorError) as e:
            raise self._failed(e) from None
        if self.pp is not None:
            self.pp.group.barrier()  # no writer returns before the checkpoint is in place
        return self.final

    def _commit(self) -> None:
        tmp, root = self.tmp, self.root
        meta = {"format": FORMAT, "version": VERSION, "step": int(self.step), "rng": self.rng,
                "extra": self.extra or {}}
        dtypes, scalars = {}, {}
        for part in sorted(tmp.glob("parts*.json")):
            d = json.loads(part.read_text())
            dtypes.update(d["dtypes"])
            scalars.update(d["scalars"])
            part.unlink()
        if self.has_optimizer:
            meta["optimizer"] = {"type": self.kind, "scalars": scalars, "param_groups": self.groups}
        meta["dtypes"] = dtypes
        meta["sha256"] = {f.name: sha256_file(f) for f in sorted(tmp.iterdir())}
        meta = json.loads(json.dumps(meta, default=_json_default))
        meta["meta_sha256"] = _meta_digest(meta)
        with open(tmp / "meta.json", "w") as f:
            json.dump(meta, f, indent=1, default=_json_default)
            f.flush()
            os.fsync(f.fileno())
        if self.final.exists():
            shutil.rmtree(self.final)
        os.replace(tmp, self.final)
        latest_tmp = root / f".latest.tmp{os.getpid()}"
        latest_tmp.write_text(self.name + "\n")
        os.replace(latest_tmp, root / "latest")
        fsync_dir(root)
        if self.keep:
            done = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_"))
            for old in done[:-self.keep]:
                shutil.rmtree(old, ignore_errors=True)


def _snapshot(root, step: int, model, optimizer, extra, keep, write, copy: bool):
    """The state this rank writes, gathered (a collective: every rank calls it), as numpy arrays
    (copies when copy=True, so that training may go on changing the tensors); None when this
    rank does not write. Called inside _gathered(optimizer)."""
    names = _param_names(model)
    # a tied parameter is stored once, under its first name (GPT-2's head is its embedding)
    stored_as = _stored_names(model)
    model_tensors = {k: full_tensor(t) for k, t in model.state_dict(keep_vars=True).items()
                     if stored_as[k] == k}
    opt_tensors, scalars, groups = {}, {}, None
    if optimizer is not None:
        sd = optimizer.state_dict()
        params = _param_list(optimizer)
        for idx, st in sd["state"].items():
            p = params[int(idx)]
            if getattr(p, "tied_copy_of", None) is not None:
                continue  # the original's stage writes the shared state
            name, shard = names[id(p)], getattr(p, "tp_shard", None)
            for k, v in st.items():
                if isinstance(v, Tensor):
                    full = shard.gather(v) if shard is not None and tuple(v.shape) == tuple(p.shape) else v
                    opt_tensors[f"{name}/{k}"] = full
                else:
                    scalars.setdefault(name, {})[k] = v
        groups = [{**{k: v for k, v in g.items() if k != "params"},
                   "params": [names[id(params[i])] for i in g["params"]]} for g in sd["param_groups"]]
    if not write:
        return None
    dtypes, model_arrays, opt_arrays = {}, {}, {}
    for prefix, tensors, arrays in (("model", model_tensors, model_arrays), ("optimizer", opt_tensors, opt_arrays)):
        for k, t in tensors.items():
            a, dtypes[f"{prefix}/{k}"] = _to_numpy(t)
            arrays[k] = a.copy() if copy else a
    kind = getattr(optimizer, "state_type", type(optimizer).__name__)  # ZeRO: its inner one's
    return _Snapshot(Path(root), f"step_{step:06d}", step, getattr(model, "pp", None), _stage_suffix(model),
                     kind, model_arrays, opt_arrays, dtypes, scalars, groups, extra, keep, optimizer is not None)


def _write_safetensors(save_file, arrays: dict, path: Path) -> None:
    save_file(arrays, str(path))
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


class _Files:
    """The tensors of every file of one kind (model or optimizer), read one at a time."""

    def __init__(self, folder: Path, kind: str, files, dtypes: dict):
        from safetensors import safe_open
        self.kind, self.dtypes, self.where = kind, dtypes, {}
        self.handles = []
        for f in files:
            h = safe_open(str(folder / f), framework="numpy")
            self.handles.append(h)
            for k in h.keys():
                self.where[k] = h

    def keys(self):
        return self.where.keys()

    def get(self, key: str) -> Tensor:
        return _from_numpy(self.where[key].get_tensor(key), self.dtypes.get(f"{self.kind}/{key}", ""))

    def part(self, key: str, like: Tensor, what: str) -> Tensor:
        """This rank's part of the stored one-process tensor `key`, shaped like `like`: its
        tensor-parallel shard (only those rows or columns are read from the file), or all of it
        (a 0-d tensor, such as a step count, is always whole)."""
        sl = self.where[key].get_slice(key)
        shape = tuple(sl.get_shape())
        shard = getattr(like, "tp_shard", None) if shape else None
        want = shard.full_shape(like.shape) if shard is not None else (tuple(like.shape) if shape else ())
        if shape != want:
            raise CheckpointError(f"{what} does not fit: checkpoint {shape} vs model {want}")
        if shard is None:
            return self.get(key)
        d, parts = shard.dim, []
        for start, stop in shard.pieces(shard.group.rank):
            index = [slice(None)] * len(shape)
            index[d] = slice(min(start, shape[d]), min(stop, shape[d]))
            a = sl[tuple(index)]
            if a.shape[d] < stop - start:  # rows past the true size: zero padding
                widths = [(0, 0)] * a.ndim
                widths[d] = (0, stop - start - a.shape[d])
                a = np.pad(a, widths)
            parts.append(a)
        return _from_numpy(np.concatenate(parts, axis=d), self.dtypes.get(f"{self.kind}/{key}", ""))


def load_checkpoint(path, model, optimizer=None) -> dict:
    """Loads a checkpoint into model (and optimizer), restores the RNG, and returns its meta
    ({"step", "extra", ...}). Whatever layout wrote it, each rank reads the tensors of its part
    of the model and cuts out its shards. Raises CheckpointError naming any mismatch."""
    folder = resolve(path)
    meta = _read_meta(folder)
    for name, digest in meta["sha256"].items():
        f = folder / name
        if not f.is_file():
            raise CheckpointError(f"{f} is missing")
        if sha256_file(f) != digest:
            raise CheckpointError(f"{f} is damaged: its sha256 does not match the one recorded "
                                  "when it was saved")
    try:
        return _load(folder, meta, model, optimizer)
    except (SafetensorError, KeyError, TypeError, ValueError, IndexError) as e:
        # a file that passed its checksum but holds what this model cannot take
        raise CheckpointError(f"{folder} cannot be loaded into this model: {type(e).__name__}: {e}") from None


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


def _load(folder: Path, meta: dict, model, optimizer) -> dict:
    dtypes = meta.get("dtypes", {})
    files = sorted(meta["sha256"])
    stored = _Files(folder, "model", [f for f in files if f.startswith("model")], dtypes)
    own = model.state_dict(keep_vars=True)
    source = _stored_names(model) if meta["version"] >= 2 else {k: k for k in own}  # 1: every alias
    missing = [k for k in own if source[k] not in stored.where]
    unexpected = [k for k in stored.keys() if k not in own] if getattr(model, "pp", None) is None else []
    if missing or unexpected:
        raise CheckpointError(f"{folder} does not fit this model: missing keys: {', '.join(missing[:8]) or '-'}; "
                              f"unexpected keys: {', '.join(unexpected[:8]) or '-'}")
    state = {k: stored.part(source[k], t, f"{folder}: {k}") for k, t in own.items()}
    try:
        with _gathered(optimizer, write=True):
            model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{folder} does not fit this model: {e}") from None
    if optimizer is not None:
        _load_optimizer(folder, meta, model, optimizer,
                        _Files(folder, "optimizer", [f for f in files if f.startswith("optimizer")], dtypes))
    default_generator.set_state(meta["rng"])
    return meta


def _load_optimizer(folder: Path, meta: dict, model, optimizer, stored: _Files) -> None:
    if "optimizer" not in meta:
        raise CheckpointError(f"{folder} holds no optimizer state")
    o = meta["optimizer"]
    kind = getattr(optimizer, "state_type", type(optimizer).__name__)  # ZeRO: its inner optimizer's
    if o["type"] != kind:
        raise CheckpointError(f"{folder} holds {o['type']} state, not {kind}")
    params = _param_list(optimizer)
    if meta["version"] == 1:  # keyed by the saving optimizer's parameter order
        names = {id(p): str(i) for i, p in enumerate(params)}
        split = "."
    else:
        names, split = _param_names(model), "/"
    by_name = {}
    for key in stored.keys():
        pname, k = key.rsplit(split, 1) if split == "/" else key.split(split, 1)
        by_name.setdefault(pname, {})[k] = key
    state = {}
    for i, p in enumerate(params):
        name = names.get(id(p))
        if name is None:
            raise CheckpointError("the optimizer holds a parameter that is not the model's")
        entries = {k: stored.part(key, p, f"{folder}: optimizer state {key}")
                   for k, key in by_name.get(name, {}).items()}
        entries.update(o["scalars"].get(name, {}))
        if entries:
            state[i] = entries
    saved_groups = o["param_groups"]
    if len(saved_groups) != len(optimizer.param_groups):
        raise CheckpointError(f"{folder}: optimizer state has {len(saved_groups)} parameter groups, "
                              f"this optimizer has {len(optimizer.param_groups)}")
    index, groups = 0, []
    for saved, own in zip(saved_groups, optimizer.param_groups):
        hyper = {k: (tuple(v) if k == "betas" else v) for k, v in saved.items() if k != "params"}
        groups.append({**hyper, "params": list(range(index, index + len(own["params"])))})
        index += len(own["params"])
    try:
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except ValueError as e:
        raise CheckpointError(f"{folder}: optimizer state does not fit: {e}") from None


@no_grad()
def save_pretrained(model, folder, write: bool = True) -> Path:
    """The model in Hugging Face transformers' format (infinitrain.hf): config.json and
    model.safetensors that `transformers`' AutoModelForCausalLM.from_pretrained loads, GPT-2 as
    GPT2LMHeadModel, LLaMA-3 as LlamaForCausalLM. Under tensor parallelism every rank of the
    group calls it (shards are gathered) and `write` says which one writes; a pipeline stage
    holds part of the model, so save from one process (or save_checkpoint, then reload)."""
    from safetensors.numpy import save_file
    from . import hf
    if getattr(model, "pp", None) is not None:
        raise CheckpointError("save_pretrained writes a whole model: a pipeline stage holds part of one. Save a "
                              "checkpoint (save_checkpoint) and call save_pretrained on a one-process model loaded from it")
    full = {name: np.ascontiguousarray(full_tensor(t).float().cpu().numpy()) for name, t in model.state_dict().items()}
    config, tensors = hf.export(model, full)
    folder = Path(folder)
    if not write:
        return folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / ".model.safetensors.tmp"
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, folder / "model.safetensors")
        atomic_write(folder / "config.json", json.dumps(config, indent=2).encode())
    except OSError as e:
        raise CheckpointError(f"could not write {folder}: {e.strerror or e}") from None
    return folder


@no_grad()
def from_pretrained(cls, folder, tp=None, pp=None, cp=None):
    """A model from a folder in transformers' format (what save_pretrained writes, or what
    transformers writes for GPT2LMHeadModel / LlamaForCausalLM: one model.safetensors or shards
    named by model.safetensors.index.json, float32, float16 or bfloat16), or in this package's
    earlier format. config.json, the tensors' names and shapes and the files' sizes are checked
    before anything is built. Under TP/PP each rank reads its slice of what it holds."""
    from . import hf
    folder = Path(folder)
    where = input_file(folder / "config.json", "config")
    try:
        config = json.loads(where.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise DataFormatError(f"{where} is not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(config, dict):
        raise DataFormatError(f"{where} is not a JSON object")
    if not hf.is_transformers_config(config):
        return _from_earlier_format(cls, folder, config, tp, pp, cp)
    cfg = hf.config_of(cls, config, folder)
    files = hf.SafetensorsFiles(hf.safetensors_files(folder))
    tied = cls.__name__ == "GPT2" or ("lm_head.weight" not in files.where and config.get("tie_word_embeddings", False))
    want = hf.expected_shapes(cls, cfg, tied)
    missing = [n for n in want if n not in files.where]
    wrong = [f"{n} is {files.shape(n)}, the config says {s}" for n, s in want.items()
             if n in files.where and files.shape(n) != s]
    if missing or wrong:
        raise DataFormatError(f"{folder} does not hold the model its config.json describes: "
                              + "; ".join(([f"missing {', '.join(missing[:6])}"] if missing else []) + wrong[:6]))
    model = cls(cfg, seed=0, tp=tp, pp=pp, cp=cp)
    arrays = hf.ours_from_theirs(cls, cfg, files, tied)
    for name, p in model.state_dict(keep_vars=True).items():
        load_full(p, from_numpy(arrays[name]()))
    return model


def _from_earlier_format(cls, folder: Path, cfg: dict, tp, pp, cp):
    """This package's format before save_pretrained wrote transformers' (our names and config)."""
    from dataclasses import fields
    from safetensors.numpy import load_file
    kind = cfg.pop("model_type", cls.__name__)
    if kind != cls.__name__:
        raise CheckpointError(f"{folder} holds a {kind}, not a {cls.__name__}")
    known = {f.name for f in fields(cls.config_class)}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise DataFormatError(f"{folder}/config.json: unknown keys {unknown} for {cls.__name__}")
    for key, v in cfg.items():
        if isinstance(v, int) and not isinstance(v, bool) and not 0 <= v <= (1 << 24):
            raise DataFormatError(f"{folder}/config.json: {key} = {v} is out of range")
    try:
        config = cls.config_class(**cfg)
        if hasattr(config, "validate"):
            config.validate()
    except (TypeError, ValueError) as e:
        raise DataFormatError(f"{folder}/config.json describes no valid {cls.__name__}: {e}") from None
    model = cls(config, seed=0, tp=tp, pp=pp, cp=cp)
    try:
        stored = load_file(str(input_file(folder / "model.safetensors", "weights")))
    except SafetensorError as e:
        raise DataFormatError(f"{folder}/model.safetensors is not readable: {e}") from None
    for name, p in model.state_dict(keep_vars=True).items():
        if name not in stored:
            raise DataFormatError(f"{folder}/model.safetensors has no {name}")
        load_full(p, from_numpy(np.ascontiguousarray(stored[name], dtype=np.float32)))
    return model


# ---- LoRA adapters alone -------------------------------------------------------------------

def save_lora(model, folder, write: bool = True, optimizer=None) -> Path:
    """Writes the model's LoRA adapters alone, as one-process tensors under one-process names:
    folder/adapter_model.safetensors (a pipeline stage: adapter_model-stage-S-of-P.safetensors)
    and folder/adapter_config.json (rank, alpha, targets). Collective over TP (shards are
    gathered) and, given a ZeRO-3 optimizer, over DP; `write` says whether this rank writes
    (one per pipeline stage)."""
    from safetensors.numpy import save_file
    from .nn.lora import lora_state
    config = getattr(model, "lora_config", None)
    if config is None:
        raise CheckpointError("this model has no LoRA adapters to save (nn.lora.apply_lora adds them)")
    with no_grad(), _gathered(optimizer):
        tensors = {n: np.ascontiguousarray(full_tensor(p).float().cpu().numpy())
                   for n, p in lora_state(model).items()}
    folder = Path(folder)
    if not write:
        return folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"adapter_model{_stage_suffix(model)}.safetensors"
        tmp = path.with_name(f".{path.name}.tmp")
        save_file(tensors, str(tmp), metadata={"format": "np"})
        os.replace(tmp, path)
        atomic_write(folder / "adapter_config.json", json.dumps(config, indent=1).encode())
    except OSError as e:
        raise CheckpointError(f"could not write LoRA adapters to {folder}: {e.strerror or e}") from None
    return folder


def read_lora_config(folder) -> dict:
    """adapter_config.json of a folder save_lora wrote, checked."""
    path = Path(folder) / "adapter_config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{folder} holds no LoRA adapters (no adapter_config.json)") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is not a readable adapter config: {e}") from None
    ok = isinstance(config, dict) and isinstance(config.get("r"), int) and config["r"] >= 1 \
        and isinstance(config.get("lora_alpha"), (int, float)) \
        and isinstance(config.get("target_modules"), list) \
        and all(isinstance(t, str) for t in config["target_modules"])
    if not ok:
        raise CheckpointError(f"{path} must hold r (a positive integer), lora_alpha (a number) and "
                              f"target_modules (names); it holds {str(config)[:200]}")
    return config


@no_grad()
def load_lora(model, folder) -> None:
    """Loads adapters that save_lora wrote (under any layout) into a model with adapters of the
    same rank: each rank takes its slice of each tensor."""
    from safetensors.numpy import load_file
    from .nn.lora import lora_state
    config = read_lora_config(folder)
    own = lora_state(model)
    mine = getattr(model, "lora_config", None)
    if not own or mine is None:
        raise CheckpointError("this model has no LoRA adapters: apply_lora(model, rank, ...) first, "
                              f"with the saved settings (rank {config['r']})")
    if mine["r"] != config["r"]:
        raise CheckpointError(f"{folder} holds rank-{config['r']} adapters, this model's have rank {mine['r']}")
    stored = {}
    for f in sorted(Path(folder).glob("adapter_model*.safetensors")):
        try:
            stored.update(load_file(str(f)))
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{f} is not a readable safetensors file: {e}") from None
    for name, p in own.items():
        if name not in stored:
            raise CheckpointError(f"{folder} has no adapter {name} (its adapters: "
                                  f"{', '.join(sorted(stored)[:6]) or 'none'})")
        shard = getattr(p, "tp_shard", None)
        want = shard.full_shape(p.shape) if shard is not None else tuple(p.shape)
        if tuple(stored[name].shape) != tuple(want):
            raise CheckpointError(f"{folder}: adapter {name} is {tuple(stored[name].shape)}, this model's {want}")
        load_full(p, from_numpy(np.ascontiguousarray(stored[name], dtype=np.float32)))
