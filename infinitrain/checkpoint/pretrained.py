"""A model's weights without its training state, in the files other tools read: Hugging Face
transformers' folder (save_pretrained, from_pretrained; the format this package wrote before
is still read) and LoRA adapters alone (save_lora, read_lora_config, load_lora). Like a
checkpoint they hold whole one-process tensors and each rank loads its slice, but they have
their own files and no meta.json, optimizer state or resume, so they live apart from the
checkpoint proper and take from it only CheckpointError (format.py) and the layout helpers of
sharded.py.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from safetensors import SafetensorError

from ..autograd import no_grad
from ..io import DataFormatError, atomic_write, input_file, progress
from ..creation import from_numpy
from ..runtime import check_fits_in_memory
from ..nn.parallel.expert_parallel.checkpoint import expert_parallel_of, gather_expert_tensors
from ..nn.parallel.tensor_parallel import full_tensor, load_full
from .format import CheckpointError, _write_safetensors
from .sharded import _gathered, _stage_suffix


@no_grad()
def save_pretrained(model, folder, write: bool = True, merge_lora: bool = False) -> Path:
    """The model in Hugging Face transformers' format (infinitrain.hf): config.json and
    model.safetensors that `transformers`' AutoModelForCausalLM.from_pretrained loads, GPT-2 as
    GPT2LMHeadModel, LLaMA-3 as LlamaForCausalLM. Under tensor parallelism every rank of the
    group calls it (shards are gathered) and `write` says which one writes; a pipeline stage
    holds part of the model, so save from one process (or save_checkpoint, then reload).
    A model with LoRA adapters is written as its base (the adapters go with save_lora), or
    with `merge_lora` as W + (alpha/r) B A, PEFT's merge_and_unload."""
    from safetensors.numpy import save_file
    from .. import hf
    from ..nn.lora import lora_layers
    if getattr(model, "pp", None) is not None:
        raise CheckpointError("save_pretrained writes a whole model: a pipeline stage holds part of one. Save a "
                              "checkpoint (save_checkpoint) and call save_pretrained on a one-process model "
                              "loaded from it")
    # keep_vars: the parameters themselves, which know their TP shard (a detached copy does not,
    # and each rank would write its own slice)
    state = {name: full_tensor(t) for name, t in model.state_dict(keep_vars=True).items()}
    ep = expert_parallel_of(model)
    if ep is not None:  # every EP rank's experts, all-gathered (a collective over the EP group)
        state = gather_expert_tensors(state, ep)
    full = {name: np.ascontiguousarray(t.float().cpu().numpy())
            for name, t in progress(state.items(), total=len(state), desc="exporting", unit="tensor")}
    for name, layer in lora_layers(model):
        A, B = full.pop(name + ".lora_A"), full.pop(name + ".lora_B")
        delta = (B @ A) * np.float32(layer.lora_scale)
        # a merged layer (nn.lora.merge_lora) holds W + delta already
        base = full[name + ".weight"] - (0 if layer.lora_on else delta)
        full[name + ".weight"] = base + delta if merge_lora else base
    try:
        config, tensors = hf.export(model, full)
    except ValueError as e:  # a model transformers' formats cannot hold (a sigmoid router, ...)
        raise CheckpointError(str(e)) from None
    folder = Path(folder)
    if not write:
        return folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / ".model.safetensors.tmp"
        _write_safetensors(save_file, tensors, tmp, metadata={"format": "pt"})
        os.replace(tmp, folder / "model.safetensors")
        atomic_write(folder / "config.json", json.dumps(config, indent=2).encode())
    except OSError as e:
        raise CheckpointError(f"could not write {folder}: {e.strerror or e}") from None
    return folder


def _read_config_json(folder: Path) -> tuple:
    where = input_file(folder / "config.json", "config")
    try:
        config = json.loads(where.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise DataFormatError(f"{where} is not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(config, dict):
        raise DataFormatError(f"{where} is not a JSON object")
    return where, config


def config_from_pretrained(folder, gpt2_class, llama_class) -> tuple:
    """(the model class, its configuration) a transformers folder's config.json describes
    (model_type gpt2: gpt2_class; the LLaMA family's: llama_class), without reading the weights."""
    from .. import hf
    folder = Path(folder)
    where, config = _read_config_json(folder)
    if not hf.is_transformers_config(config):
        raise DataFormatError(f"{where}: model_type {config.get('model_type')!r} is none this package reads "
                              f"(gpt2, {', '.join(hf.hf_llama.KINDS)})")
    cls = gpt2_class if config["model_type"] == "gpt2" else llama_class
    return cls, hf.config_of(cls, config, folder)


@no_grad()
def from_pretrained(cls, folder, tp=None, pp=None, cp=None, ep=None):
    """A model from a folder in transformers' format (what save_pretrained writes, or what
    transformers writes for GPT2LMHeadModel / LlamaForCausalLM: one model.safetensors or shards
    named by model.safetensors.index.json, float32, float16 or bfloat16), or in this package's
    earlier format. config.json, the tensors' names and shapes and the files' sizes are checked
    before anything is built. Under TP/PP each rank reads its slice of what it holds."""
    from .. import hf
    folder = Path(folder)
    where, config = _read_config_json(folder)
    if not hf.is_transformers_config(config):
        return _from_earlier_format(cls, folder, config, tp, pp, cp)
    cfg = hf.config_of(cls, config, folder)
    numel = cls._llmc_numel(cfg)  # bounded before its names and shapes are even listed
    try:
        check_fits_in_memory(4 * numel, f"the model {where} describes ({numel:,} parameters in float32)")
    except MemoryError as e:
        raise DataFormatError(str(e)) from None
    files = hf.SafetensorsFiles(hf.safetensors_files(folder))
    tied = cls.__name__ == "GPT2" or ("lm_head.weight" not in files.where and config.get("tie_word_embeddings", False))
    want = hf.expected_shapes(cls, cfg, tied)
    missing = [n for n in want if n not in files.where]
    wrong = [f"{n} is {files.shape(n)}, the config says {s}" for n, s in want.items()
             if n in files.where and files.shape(n) != s]
    if missing or wrong:
        raise DataFormatError(f"{folder} does not hold the model its config.json describes: "
                              + "; ".join(([f"missing {', '.join(missing[:6])}"] if missing else []) + wrong[:6]))
    if ep is not None and not getattr(cfg, "num_experts", 0):
        raise DataFormatError(f"{folder} holds a dense model: expert parallelism needs experts (a Mixtral or "
                              "Qwen3-MoE folder)")
    model = cls(cfg, seed=0, tp=tp, pp=pp, cp=cp, **({"ep": ep} if ep is not None else {}))
    arrays, state = hf.ours_from_theirs(cls, cfg, files, tied), model.state_dict(keep_vars=True)
    for name, p in progress(state.items(), total=len(state), desc=f"loading {folder.name}", unit="tensor"):
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

def save_lora(model, folder, write: bool = True, optimizer=None, base_model: str | None = None) -> Path:
    """Writes the model's LoRA adapters alone, in PEFT's format for GPT-2 and LLaMA-3
    (infinitrain.hf_peft: adapter_config.json and adapter_model.safetensors that
    peft.PeftModel.from_pretrained applies to the transformers model save_pretrained writes;
    `base_model` is recorded as base_model_name_or_path), in this package's own format (our
    names) for other models. A pipeline stage writes its layers to
    adapter_model-stage-S-of-P.safetensors (load_lora reads them together; PEFT wants one file).
    Collective over TP (shards are gathered) and, given a ZeRO-3 optimizer, over DP; `write`
    says whether this rank writes (one per pipeline stage)."""
    from safetensors.numpy import save_file
    from .. import hf_peft
    from ..nn.lora import _matches, lora_state
    config = getattr(model, "lora_config", None)
    if config is None:
        raise CheckpointError("this model has no LoRA adapters to save (nn.lora.apply_lora adds them)")
    with no_grad(), _gathered(optimizer):
        tensors = {n: np.ascontiguousarray(full_tensor(p).float().cpu().numpy())
                   for n, p in lora_state(model).items()}
    kind = type(model).__name__
    if kind in ("GPT2", "LLaMA3"):
        cfg, ranks = model.config, config.get("ranks", {})
        lora = {n[:-len(".lora_A")]: (a, tensors[n[:-1] + "B"]) for n, a in tensors.items() if n.endswith("_A")}
        subs = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj") + (("mlp.c_fc2",) if kind == "LLaMA3" else ())
        adapted = [f"transformer.h.{i}.{s}" for i in range(cfg.n_layer) for s in subs
                   if _matches(f"transformer.h.{i}.{s}", config["target_modules"])]
        try:
            config, tensors = hf_peft.export(kind, cfg, lora, ranks, config["r"], config["lora_alpha"], adapted,
                                             base_model)
        except hf_peft.PeftFormatError as e:
            raise CheckpointError(f"cannot write PEFT adapters: {e}") from None
    folder = Path(folder)
    if not write:
        return folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"adapter_model{_stage_suffix(model)}.safetensors"
        tmp = path.with_name(f".{path.name}.tmp")
        _write_safetensors(save_file, tensors, tmp, metadata={"format": "pt"})
        os.replace(tmp, path)
        atomic_write(folder / "adapter_config.json", json.dumps(config, indent=2).encode())
    except OSError as e:
        raise CheckpointError(f"could not write LoRA adapters to {folder}: {e.strerror or e}") from None
    return folder


def read_lora_config(folder) -> dict:
    """adapter_config.json of a folder of adapters (PEFT's, or this package's earlier format), checked."""
    from .. import hf_peft
    path = Path(folder) / "adapter_config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{folder} holds no LoRA adapters (no adapter_config.json)") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is not a readable adapter config: {e}") from None
    targets = config.get("target_modules") if isinstance(config, dict) else None
    ok = isinstance(config, dict) and type(config.get("r")) is int and config["r"] >= 1 \
        and isinstance(config.get("lora_alpha"), (int, float)) and not isinstance(config["lora_alpha"], bool) \
        and (isinstance(targets, str) or isinstance(targets, list) and all(isinstance(t, str) for t in targets))
    if not ok:
        raise CheckpointError(f"{path} must hold r (a positive integer), lora_alpha (a number) and "
                              f"target_modules (names); it holds {str(config)[:200]}")
    if hf_peft.is_peft_config(config):
        try:
            hf_peft.check_config(config, path)
        except hf_peft.PeftFormatError as e:
            raise CheckpointError(str(e)) from None
    return config


@no_grad()
def load_lora(model, folder, alpha: float | None = None) -> list:
    """Loads adapters (PEFT's format, or what save_lora wrote before it wrote PEFT's) into a
    model under any layout, each rank taking its slice of each tensor, and returns the adapted
    layers' names. PEFT adapters are applied as their config says when the model has none yet
    (nn.lora.apply_lora; `alpha`, if given, instead of theirs); a model with adapters must have
    them on the same layers, of the same ranks. Their scale is the model's: B is rescaled to
    it, so the model computes what the file's adapters compute."""
    from .. import hf, hf_peft
    from ..nn.lora import apply_lora, lora_layers
    config = read_lora_config(folder)
    if not hf_peft.is_peft_config(config):
        _load_earlier_lora(model, folder, config)
        return [n for n, _ in lora_layers(model)]
    files = sorted(Path(folder).glob("adapter_model*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder} has no adapter_model.safetensors")
    try:
        stored = hf.SafetensorsFiles(files)
        lora, ranks = hf_peft.import_(type(model).__name__, model.config, config,
                                      {n: stored(n) for n in stored.where})
    except (DataFormatError, hf_peft.PeftFormatError) as e:
        raise CheckpointError(f"{folder}: {e}") from None
    if getattr(model, "lora_config", None) is None:
        try:
            apply_lora(model, config["r"], config["lora_alpha"] if alpha is None else alpha, sorted(lora), ranks=ranks)
        except ValueError as e:
            raise CheckpointError(f"{folder}: {e}") from None
    modules = dict(model.named_modules())
    mine = dict(lora_layers(model))
    stray = sorted(n for n in lora if n in modules and n not in mine)
    if stray or set(mine) - set(lora):
        raise CheckpointError(f"{folder} adapts other layers than this model: "
                              + "; ".join(([f"it adapts {', '.join(stray[:4])}"] if stray else [])
                                          + ([f"it has no adapter for {', '.join(sorted(set(mine) - set(lora))[:4])}"]
                                             if set(mine) - set(lora) else [])))
    scale = config["lora_alpha"] / config["r"]
    for name, layer in mine.items():
        A, B = lora[name]
        for p, a in ((layer.lora_A, A), (layer.lora_B, B * np.float32(scale / layer.lora_scale))):
            shard = getattr(p, "tp_shard", None)
            want = shard.full_shape(p.shape) if shard is not None else tuple(p.shape)
            if a.shape != tuple(want):
                raise CheckpointError(f"{folder}: the adapter of {name} is rank {A.shape[0]} ({a.shape}), this "
                                      f"model's is {tuple(want)}")
            load_full(p, from_numpy(np.ascontiguousarray(a, dtype=np.float32)))
    return list(mine)


def _load_earlier_lora(model, folder, config: dict) -> None:
    """Adapters as save_lora wrote them before PEFT's format: our names, one-process tensors."""
    from safetensors.numpy import load_file
    from ..nn.lora import lora_state
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
