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

This file gathers their public names, and the few private ones that tests read. A name set
here reaches no part: code that replaces a function (a test's monkeypatch) sets it on the part
that looks it up, such as writer.sha256_file or writer._write_safetensors.
"""
from __future__ import annotations

from ..io import sha256_file  # noqa: F401  (tests read checkpoint.sha256_file)
from .format import FORMAT, READABLE_VERSIONS, VERSION, CheckpointError, ensure_writable, read_meta, resolve
from .format import _meta_digest  # noqa: F401  (tests read it)
from .writer import AsyncSave
from .sharded import load_checkpoint, save_checkpoint, save_checkpoint_async
from .pretrained import config_from_pretrained, from_pretrained, load_lora, read_lora_config, save_lora, save_pretrained

__all__ = ["FORMAT", "VERSION", "READABLE_VERSIONS", "CheckpointError", "ensure_writable", "resolve", "read_meta",
           "AsyncSave", "save_checkpoint", "save_checkpoint_async", "load_checkpoint", "save_pretrained",
           "from_pretrained", "config_from_pretrained", "save_lora", "read_lora_config", "load_lora"]
