"""Writing one checkpoint folder from state already taken out of the model (a `_Snapshot`,
which sharded.py builds): this rank's files go into a temporary folder and are synced; once
every writer's files are on disk the leader writes meta.json with every file's checksum,
renames the folder into place and moves `latest` the same way, then drops checkpoints past
`keep`. A save that fails or is killed part-way leaves the previous checkpoint as `latest`.
`AsyncSave` runs the same writing on a background thread and commits when polled
(save_checkpoint_async). This module owns the crash safety of a save; it knows nothing of
models or optimizers, and of the layout only the pipeline group its writers meet in (one writer
per stage). It builds on format.py alone.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from safetensors import SafetensorError

from ..io import fsync_dir, sha256_file
from ..random import default_generator
from .format import FORMAT, VERSION, CheckpointError, _json_default, _meta_digest, _write_safetensors


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
            for old in rotated_out(root, self.keep, protect=self.final):
                shutil.rmtree(old, ignore_errors=True)


def recorded_step(folder: Path) -> int | None:
    """The step a checkpoint folder's meta.json records, or None where it cannot be read."""
    try:
        return int(json.loads((folder / "meta.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def newest_checkpoint(root) -> Path | None:
    """The checkpoint a run saving into root would resume from: the one `latest` names, else (a
    job killed between a checkpoint's rename and `latest`'s) the step folder recording the
    highest step; None when root holds none."""
    root = Path(root)
    if not root.is_dir():
        return None
    if (root / "latest").is_file():
        return root
    steps = {p: recorded_step(p) for p in root.iterdir() if p.is_dir() and p.name.startswith("step_")}
    steps = {p: s for p, s in steps.items() if s is not None}
    return max(steps, key=steps.get) if steps else None


def rotated_out(root: Path, keep: int, protect: Path) -> list:
    """The checkpoint folders of root past the newest `keep`, ordered by the step each records
    (not by name: step_1000000 sorts before step_999999), never `protect` (the one just written)
    nor the one `latest` names, nor a folder whose step cannot be read (not ours to judge)."""
    latest = (root / "latest").read_text().strip() if (root / "latest").is_file() else None
    steps = {}
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("step_") and p != protect and p.name != latest:
            step = recorded_step(p)
            if step is not None:
                steps[p] = step
    kept = 1 + (latest is not None and latest != protect.name)  # protect and latest stay, counted first
    return sorted(steps, key=steps.get)[:max(0, len(steps) - max(0, keep - kept))]


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
        from ..dtypes import int64
        from ..creation import tensor
        from ..nn.parallel.process_group import ReduceOp
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
