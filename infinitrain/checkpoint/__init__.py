"""Training checkpoints: everything needed to resume a run exactly, in files that cannot
execute code (safetensors for tensors, JSON for the rest), holding the one-process tensors
under their one-process names whatever the layout that wrote them, and loadable under any
other layout; and a model's weights alone, in Hugging Face transformers' format or as LoRA
adapters.

A checkpoint is written into a temporary folder, synced, and renamed into place; `latest` is
replaced the same way afterwards. A save that is killed part-way leaves the previous checkpoint
as `latest`. Loading checks the format version, every file's checksum, and the model's names and
shapes, and says exactly what does not match.

The parts, each importing only those listed before it:

    format      the files and meta.json on disk, their checks, CheckpointError, resolve/read_meta
    writer      writing one checkpoint folder atomically, now or on a background thread (AsyncSave)
    sharded     any layout to one-process tensors and back: save_checkpoint(_async), load_checkpoint
    pretrained  transformers' format (save_pretrained, from_pretrained) and LoRA adapters

This file gathers their public names, and the few private ones that tests reach for, and keeps
the package one namespace as it was one module: a name set here (checkpoint.sha256_file = ...,
monkeypatch.setattr(checkpoint, "_write_safetensors", ...)) is set in each part that holds the
same object under that name, so the code that calls it sees the change.
"""
from __future__ import annotations

import sys
from types import ModuleType

from ..io import sha256_file  # noqa: F401  (tests read and replace checkpoint.sha256_file)
from . import format, pretrained, sharded, writer
from .format import FORMAT, READABLE_VERSIONS, VERSION, CheckpointError, ensure_writable, read_meta, resolve
from .format import _meta_digest, _write_safetensors  # noqa: F401  (tests reach for them)
from .writer import AsyncSave
from .sharded import load_checkpoint, save_checkpoint, save_checkpoint_async
from .pretrained import from_pretrained, load_lora, read_lora_config, save_lora, save_pretrained

__all__ = ["FORMAT", "VERSION", "READABLE_VERSIONS", "CheckpointError", "ensure_writable", "resolve", "read_meta",
           "AsyncSave", "save_checkpoint", "save_checkpoint_async", "load_checkpoint", "save_pretrained",
           "from_pretrained", "save_lora", "read_lora_config", "load_lora"]

_PARTS = (format, writer, sharded, pretrained)
_UNSET = object()


class _Package(ModuleType):
    """This package, whose names set from outside reach the parts that use them."""

    def __setattr__(self, name: str, value) -> None:
        old = self.__dict__.get(name, _UNSET)
        if old is not _UNSET and not isinstance(old, ModuleType):
            for part in _PARTS:
                if part.__dict__.get(name, _UNSET) is old:
                    setattr(part, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
