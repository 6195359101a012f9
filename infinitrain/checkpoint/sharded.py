"""Between a model's parallel layout and the one-process tensors a checkpoint holds, in both
directions, which is why saving and loading sit together: they must agree on every name and
shard. Saving (save_checkpoint, save_checkpoint_async): each tensor is stored under its
one-process name (a tied parameter once, a pipeline stage's copy under the original's name),
tensor-parallel shards are gathered whole and ZeRO-3 parameters made whole for the while, and
what this rank writes is taken as a snapshot that writer.py writes. Loading (load_checkpoint):
every file's checksum is checked, then each rank reads from whichever files hold them just the
tensors its part of the model needs, and of each only the rows or columns of its own shard; the
optimizer's state, stored by parameter name, is keyed back to this optimizer's parameter order.
Builds on format.py and writer.py.
"""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import numpy as np

from safetensors import SafetensorError

from ..io import progress, sha256_file
from ..random import default_generator
from ..tensor import Tensor
from ..nn.parallel.expert_parallel.checkpoint import (every_rank_names, expert_parallel_of, gather_expert_tensors,
                                                      is_expert_name)
from ..nn.parallel.tensor_parallel import full_tensor
from .format import CheckpointError, _from_numpy, _read_meta, _to_numpy, resolve
from .writer import AsyncSave, _Snapshot


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


def save_checkpoint(root, step: int, model, optimizer=None, extra: dict | None = None,
                    keep: int | None = None, write: bool = True, name: str | None = None) -> Path:
    """Writes DIR/step_<step>/ (or DIR/<name>/) atomically and points DIR/latest at it; with `keep`, only the
    newest `keep` checkpoints are kept. Collective over the layout: under tensor parallelism
    every rank calls it (shards are gathered over their group); `write` says whether this rank
    writes. Under pipeline parallelism exactly one rank per stage, all of one pipeline (say
    DP rank 0, TP rank 0), writes: each its stage's part, stage 0 the rest."""
    with _gathered(optimizer):  # ZeRO-3: the parameters whole while they are read and written
        snap = _snapshot(root, step, model, optimizer, extra, keep, write, copy=False, folder=name)
        if snap is None:
            return Path(root) / (name or f"step_{step:06d}")
        snap.begin()
        snap.write_files()  # the arrays are the tensors' own memory: written before it is released
    return snap.commit()


def save_checkpoint_async(root, step: int, model, optimizer=None, extra: dict | None = None,
                          keep: int | None = None, write: bool = True) -> AsyncSave:
    """save_checkpoint with the writing in the background: the same collectives now (shards
    gathered, the state copied to host memory), the same files, byte for byte, later."""
    with _gathered(optimizer):
        snap = _snapshot(root, step, model, optimizer, extra, keep, write, copy=True)
    return AsyncSave(snap)


def _snapshot(root, step: int, model, optimizer, extra, keep, write, copy: bool, folder: str | None = None):
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
    ep = expert_parallel_of(model)
    if ep is not None:  # every EP rank's experts, under their one-process names
        model_tensors = gather_expert_tensors(model_tensors, ep)
        opt_tensors = gather_expert_tensors(opt_tensors, ep)
        scalars = {**scalars, **{name: scalars[own] for name, own in every_rank_names(scalars, ep).items()}}
    if not write:
        return None
    dtypes, model_arrays, opt_arrays = {}, {}, {}
    for prefix, tensors, arrays in (("model", model_tensors, model_arrays), ("optimizer", opt_tensors, opt_arrays)):
        for k, t in progress(tensors.items(), total=len(tensors), desc=f"saving the {prefix}", unit="tensor"):
            a, dtypes[f"{prefix}/{k}"] = _to_numpy(t)
            arrays[k] = a.copy() if copy else a
    kind = getattr(optimizer, "state_type", type(optimizer).__name__)  # ZeRO: its inner one's
    return _Snapshot(Path(root), folder or f"step_{step:06d}", step, getattr(model, "pp", None), _stage_suffix(model),
                     kind, model_arrays, opt_arrays, dtypes, scalars, groups, extra, keep, optimizer is not None)


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
    for name, digest in progress(meta["sha256"].items(), total=len(meta["sha256"]), desc="checking checksums",
                                 unit="file"):
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


def _experts_difference(missing, unexpected) -> str:
    """A sentence when the mismatch is a mixture-of-experts model against a dense one."""
    def moe(names):
        return any(".experts." in n for n in names)
    if moe(unexpected) and not moe(missing):
        return ("the checkpoint's model has mixture-of-experts layers (experts) where this one has dense MLPs: "
                "build it with the checkpoint's num_experts; ")
    if moe(missing) and not moe(unexpected):
        return ("this model has mixture-of-experts layers (experts) where the checkpoint's has dense MLPs "
                "(num_experts 0); ")
    return ""


def _load(folder: Path, meta: dict, model, optimizer) -> dict:
    dtypes = meta.get("dtypes", {})
    files = sorted(meta["sha256"])
    stored = _Files(folder, "model", [f for f in files if f.startswith("model")], dtypes)
    own = model.state_dict(keep_vars=True)
    source = _stored_names(model) if meta["version"] >= 2 else {k: k for k in own}  # 1: every alias
    missing = [k for k in own if source[k] not in stored.where]
    # (a pipeline stage holds some layers; an expert-parallel rank some experts, the others' are the file's too)
    experts_apart = expert_parallel_of(model) is not None
    unexpected = [k for k in stored.keys() if k not in own and not (experts_apart and is_expert_name(k))] \
        if getattr(model, "pp", None) is None else []
    if missing or unexpected:
        raise CheckpointError(f"{folder} does not fit this model: {_experts_difference(missing, unexpected)}"
                              f"missing keys: {', '.join(missing[:8]) or '-'}; "
                              f"unexpected keys: {', '.join(unexpected[:8]) or '-'}")
    state = {k: stored.part(source[k], t, f"{folder}: {k}")
             for k, t in progress(own.items(), total=len(own), desc=f"loading {folder.name}", unit="tensor")}
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
